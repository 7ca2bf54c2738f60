"""Grading a free-text diagnosis: AgentClinic's moderator, with a normalised string match as the fallback.

AgentClinic's moderator (`compare_results` in agentclinic.py) is a model asked, with the doctor's
whole diagnosis turn, "Here is the correct diagnosis: ... Here was the doctor dialogue: ... Are these
the same?" under the system prompt "... Please respond only with Yes or No. Nothing else.", and the
case is correct when the reply, whitespace collapsed and lower-cased, is exactly `yes`. That is
what `judge` asks, verbatim, of the judge model: a separate one (`--judge-model`, `--judge-base-url`)
or else the run's own. When no model is configured or it is unreachable, the string match decides,
and the result says so (`method`), so a report can tell the two apart. The string match refuses a
negated diagnosis ("not tuberculosis", "no evidence of ..."), one with a `non-` the correct one lacks
("Non-Hodgkin lymphoma" for Hodgkin lymphoma), and hedges naming several diagnoses ("X vs Y", "X or
Y", "X/Y") unless every one of them matches.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Literal


from grandrounds.handlers.llm.errors import LLMUnavailable
from grandrounds.handlers.llm.structured import Mode

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


_HEDGE = re.compile(r"\s(?:or|vs\.?|versus)\s|;|/|\bdifferential\b", re.IGNORECASE)
_NEGATION = re.compile(r"\b(?:not|no|without|unlikely|excluded|negative|rule[ds]?\s+out|ruled\s+out|absence|absent)\b",
                       re.IGNORECASE)
_NON_PREFIX = re.compile(r"\bnon[\s-]?(?=[a-z])", re.IGNORECASE)


def _negated(predicted: str, gold: str) -> bool:
    """The prediction denies something the gold does not: a negation word, or a `non-` prefix."""
    if _NEGATION.search(predicted) and not _NEGATION.search(gold):
        return True
    return bool(_NON_PREFIX.search(predicted)) and not _NON_PREFIX.search(gold)


def string_match(predicted: str, gold: str) -> bool:
    """Token containment: every word of the gold (or one of its alternatives) is in the prediction;
    or the prediction is a shorter form of the gold that keeps at least 2/3 of its words (so
    "myasthenia gravis" matches "Ocular myasthenia gravis" but "disease" matches nothing).
    A hedge ("A or B", "A vs B", "A/B") is correct only if each alternative is: naming the gold among
    others is not a diagnosis. A negated prediction ("not A", "A ruled out", "non-A" for A) is wrong."""
    if _negated(predicted, gold):
        return False
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


@dataclass(frozen=True)
class Judgement:
    correct: bool
    method: Literal["llm", "string-match"]
    reason: str


MODERATOR_SYSTEM = ("You are responsible for determining if the corrent diagnosis and the doctor diagnosis are the "
                    "same disease. Please respond only with Yes or No. Nothing else.")
"""AgentClinic's moderator system prompt, verbatim (its typo included)."""


def judge_messages(doctor_turn: str, gold: str) -> list[dict[str, str]]:
    """AgentClinic's moderator question, verbatim: the doctor's whole diagnosis turn, not only the name."""
    return [{"role": "system", "content": MODERATOR_SYSTEM},
            {"role": "user", "content": "\nHere is the correct diagnosis: " + gold + "\n Here was the doctor dialogue: "
                                        + doctor_turn + "\nAre these the same?"}]


def moderator_verdict(reply: str) -> bool:
    """agentclinic.py: `re.sub("\\s+", " ", answer)`, then `answer.lower() == "yes"`."""
    return re.sub(r"\s+", " ", reply).lower() == "yes"


def fallback(predicted: str | None, gold: str, why: str) -> Judgement:
    ok = predicted is not None and string_match(predicted, gold)
    return Judgement(ok, "string-match", f"{why}; normalised token match {'found' if ok else 'not found'}")


async def judge(predicted: str | None, gold: str, gateway=None, recorder=None, mode: Mode = "auto",
                doctor_turn: str | None = None) -> Judgement:
    """The moderator's verdict when a gateway is given and answers, else the string match.
    `doctor_turn`: the doctor's diagnosis turn as said (`DIAGNOSIS READY: ...`), what AgentClinic
    shows its moderator; the extracted diagnosis when not given. `mode` is unused (the moderator
    answers in text, as officially) and kept for callers."""
    if predicted is None or not predicted.strip():
        return Judgement(False, "string-match", "no diagnosis given")
    if gateway is None:
        return fallback(predicted, gold, "no judge model configured")
    try:
        reply = await gateway.complete(judge_messages(doctor_turn or f"DIAGNOSIS READY: {predicted}", gold),
                                       recorder, "judge", {"max_tokens": 16})
    except LLMUnavailable as exc:
        return fallback(predicted, gold, f"judge unavailable ({exc.kind})")
    said = reply.text
    return Judgement(moderator_verdict(said), "llm", f"moderator said {said.strip()[:60]!r}")
