"""Grading a free-text diagnosis: an LLM judge, with a normalised string match as the fallback.

AgentClinic's moderator asks a model whether the doctor's diagnosis and the correct one "are the
same disease" (Yes/No). Here the judge answers through structured outputs ({correct, reason}), so
the verdict is parsed, not guessed from prose. When no model is configured, or the judge's reply is
unusable even after the structured-output repair retry, or the model is unreachable, the string
match decides, and the result says so (`method`), so a report can tell the two apart.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from grandrounds.handlers.llm.errors import LLMUnavailable, StructuredOutputError
from grandrounds.handlers.llm.structured import Mode, structured

_ARTICLES = frozenset({"a", "an", "the"})
_PAREN = re.compile(r"\(([^)]*)\)")
_NON_WORD = re.compile(r"[^a-z0-9\s]+")


def normalise(text: str) -> str:
    """Lowercase, fold accents and curly quotes, drop possessive 's, punctuation and articles."""
    t = re.sub(r"['\u2019]s\b", "", text.lower())  # "Hirschsprung's disease" == "Hirschsprung disease"
    t = unicodedata.normalize("NFKD", t).encode("ascii", "ignore").decode("ascii")
    t = _NON_WORD.sub(" ", t.replace("'", ""))
    return " ".join(w for w in t.split() if w not in _ARTICLES)


def _stem(word: str) -> str:
    # plural-insensitive only: "cysts" == "cyst"; words ending in -ss/-us/-is keep their s
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")) else word


def tokens(text: str) -> set[str]:
    return {_stem(w) for w in normalise(text).split()}


def alternatives(gold: str) -> list[set[str]]:
    """The gold diagnosis as token sets: whole, without its parenthesis, and the parenthesis alone
    ("Progressive multifocal encephalopathy (PML)" is also "PML")."""
    alts = [tokens(gold), tokens(_PAREN.sub(" ", gold))]
    alts += [tokens(inner) for inner in _PAREN.findall(gold)]
    return [a for a in alts if a]


_HEDGE = re.compile(r"\s(?:or|vs\.?|versus)\s|;|\bdifferential\b", re.IGNORECASE)


def string_match(predicted: str, gold: str) -> bool:
    """Token containment: every word of the gold (or one of its alternatives) is in the prediction;
    or the prediction is a shorter form of the gold that keeps at least 2/3 of its words (so
    "myasthenia gravis" matches "Ocular myasthenia gravis" but "disease" matches nothing).
    A hedge ("A or B") is correct only if each alternative is: naming the gold among others is
    not a diagnosis."""
    parts = [p for p in _HEDGE.split(predicted) if p.strip()]
    if len(parts) > 1 and not _HEDGE.search(gold):
        return all(_contains(p, gold) for p in parts)
    return _contains(predicted, gold)


def _contains(predicted: str, gold: str) -> bool:
    pred = tokens(predicted)
    if not pred:
        return False
    for alt in alternatives(gold):
        if alt <= pred:
            return True
        if pred <= alt and 3 * len(pred) >= 2 * len(alt):
            return True
    return False


class JudgeVerdict(BaseModel):
    """The judge's structured reply."""

    model_config = ConfigDict(extra="ignore")

    correct: bool = Field(description="True if the doctor's diagnosis is the same disease as the correct one.")
    reason: str = Field(description="One sentence: why.")


@dataclass(frozen=True)
class Judgement:
    correct: bool
    method: Literal["llm", "string-match"]
    reason: str


JUDGE_SYSTEM = ("You are responsible for determining if the correct diagnosis and the doctor diagnosis are the "
                "same disease. Synonyms, abbreviations and more specific forms of the same disease count as "
                "the same; a different disease, or a list of alternatives, does not.")


def judge_messages(predicted: str, gold: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": f"Here is the correct diagnosis: {gold}\n"
                                        f"Here was the doctor's diagnosis: {predicted}\n"
                                        "Are these the same disease? Reply with JSON {\"correct\": true|false, "
                                        "\"reason\": \"...\"}."}]


def fallback(predicted: str | None, gold: str, why: str) -> Judgement:
    ok = predicted is not None and string_match(predicted, gold)
    return Judgement(ok, "string-match", f"{why}; normalised token match {'found' if ok else 'not found'}")


async def judge(predicted: str | None, gold: str, gateway=None, recorder=None, mode: Mode = "auto") -> Judgement:
    """The model's verdict when a gateway is given and answers usably, else the string match."""
    if predicted is None or not predicted.strip():
        return Judgement(False, "string-match", "no diagnosis given")
    if gateway is None:
        return fallback(predicted, gold, "no judge model configured")
    try:
        verdict = await structured(gateway, judge_messages(predicted, gold), JudgeVerdict, recorder, "judge", mode)
    except StructuredOutputError as exc:
        return fallback(predicted, gold, f"judge output unusable ({str(exc)[:160]})")
    except LLMUnavailable as exc:
        return fallback(predicted, gold, f"judge unavailable ({exc.kind})")
    return Judgement(verdict.correct, "llm", verdict.reason.strip()[:500])
