"""Parameters of the `long-context` baseline (not from a seed paper: the plain "put recent history in
the prompt" baseline). Each default says where it comes from."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from grandrounds.handlers.policies.config import PolicyBase


class LongContextPolicy(PolicyBase):
    """Long context: the most recent past cases and their outcomes in the prompt, newest first.

    Each past case shows its question, its options, the agent's answer, whether it was right and the
    confirmed answer, up to a token budget; no retrieval by similarity, nothing learnt beyond keeping
    the cases."""

    name: Literal["long-context"] = "long-context"
    writing: bool = True
    """Keep each case after its feedback (false freezes memory: offline test mode)."""
    context_tokens: int = Field(3000, ge=0)
    """Budget of the past-cases section, in tokens (estimated with chars_per_token; 0: none shown).
    3,000: `grandrounds model serve` gives the local 1.5 B model 8,192 tokens (grandrounds/local_model.py
    `N_CTX`), and the system prompt, the case itself and the agent's steps need the rest; on two CPU cores
    the model reads ~50-90 prompt tokens a second, so a full budget costs tens of seconds per model call."""
    chars_per_token: float = Field(4.0, gt=0)
    """Characters per token of the estimate: the budget in characters is context_tokens × this.
    Rounded down. About 4 for English prose under the BPE tokenizers of GPT and Qwen models; clinical
    text with numbers and abbreviations runs somewhat lower, so the budget is an estimate, never a count
    of the model's own tokens (which would make the prompt depend on the tokenizer, not on the log)."""
    max_cases: int = Field(0, ge=0)
    """At most this many past cases, whatever the budget allows (0: as many as fit the budget)."""

    ablations: ClassVar[dict[str, dict[str, Any]]] = {"no-writing": {"writing": False},
                                                       "last-case": {"max_cases": 1}}
