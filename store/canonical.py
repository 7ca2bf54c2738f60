"""Canonical JSON: the one byte representation every hash in grandrounds is computed over.

Keys sorted, no whitespace, UTF-8, floats by Python's shortest round-trip repr. Two
processes (or machines) that build equal payloads get equal bytes, which is what makes
fingerprints and the hash chain meaningful.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""What `json.dumps` with these arguments builds on every call (it constructs an encoder for any
non-default argument) and then calls `.encode` on: the same bytes, without an encoder object per
event, payload digest and chain link (a replay encodes ~16 values a case)."""


def canonical_json(value: Any) -> str:
    return _ENCODER.encode(value)


def sha256_hex(text: str | bytes) -> str:
    if isinstance(text, str):
        text = text.encode("utf-8")
    return hashlib.sha256(text).hexdigest()


def content_hash(value: Any) -> str:
    return sha256_hex(canonical_json(value))
