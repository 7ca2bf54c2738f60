"""What a case *is*, apart from its id: the leakage guard's second key.

The leakage guard (DESIGN §6: a case never retrieves memory derived from itself) compared case ids
only, so the same case under a new id, or with its options shuffled, retrieved the memory it had
itself produced (a frozen split whose test cases were the training cases renamed scored 1.0 from
it). A case's content key is a digest of its normalised question (MCQ; the instruction and context
of a tool task) and its normalised option texts in sorted order, so letters, option order, case id,
letter case, spacing and punctuation do not matter. The projection maps content keys to the cases
that carried them (`MemoryProjection.own_cases`), and every policy's guard skips items derived from
any of them.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Iterable

from grandrounds.store.canonical import canonical_json, sha256_hex

_NOT_WORD = re.compile(r"[^\w]+")


def normalise(text: str) -> str:
    """Case-folded NFKC text with every run of punctuation and white space made one space."""
    return _NOT_WORD.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def content_key(case: dict[str, Any]) -> str | None:
    """The content key of a case as `case.received` holds it; None when it has no text to match on
    (a dialogue case, or the stand-in an erasure leaves: such cases are guarded by id only)."""
    text = " ".join(normalise(v) for v in (case.get("question"), case.get("instruction"), case.get("context"))
                    if isinstance(v, str))
    if not text.strip():
        return None
    options = case.get("options")
    opts = sorted(normalise(str(v)) for v in options.values()) if isinstance(options, dict) else []
    return sha256_hex(canonical_json([text, opts]))[:32]


def own_set(own: str | Iterable[str]) -> frozenset[str]:
    """The cases a retrieval must not draw on: one case id, or a case and its content twins."""
    return frozenset((own,)) if isinstance(own, str) else frozenset(own)
