"""Helpers for the gateway and agent tests: a fast hashing embedder and run wiring."""

from __future__ import annotations

import hashlib
import re

import numpy as np

from grandrounds.app import run_cases
from grandrounds.handlers.llm.gateway import RetryPolicy
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.runs import RunSpec
from grandrounds.store.embeddings import EmbeddingCache

SECRET = "sk-test-SECRET-never-store-0123456789"
MODEL = "fake-clinician-1"
FAST_RETRY = RetryPolicy(max_attempts=4, backoff_s=0.0)


class HashEmbedder:
    """Bag of hashed words, normalised: deterministic, instant, good enough for retrieval tests."""

    name = "test-hash-64"
    dim = 64

    def embed_one(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for w in re.findall(r"[a-z]{3,}", text.lower()):
            v[int(hashlib.sha256(w.encode()).hexdigest()[:8], 16) % self.dim] += 1.0
        n = float(np.linalg.norm(v))
        return v / n if n else v


def openai_spec(tools: dict[str, float] | None = None) -> RunSpec:
    return RunSpec(policy=EvoMedAgentPolicy(), backbone="openai", model=MODEL, seed=0, tools=tools or {})


def live_options(server, **extra) -> dict:
    return {"base_url": server.base_url, "api_key": SECRET, "retry": FAST_RETRY, **extra}


def run(store, cases, spec, run_id, options):
    return run_cases(store, cases, spec, run_id=run_id, cache=EmbeddingCache(HashEmbedder(), store.conn),
                     backbone_options=options)
