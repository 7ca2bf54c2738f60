"""Memory a small model can use: relevance floors, precedents, and a review gate for reflections.

A real 1.5 B model copies whatever memory text it is shown into its own reasoning, so what is
shown must be relevant and must say plainly what was true:
- floors: an episode is shown only when its case is similar enough to this one (cosine of the
  question embeddings), a rule only when its trigger terms occur in this case; with nothing
  relevant the prompt is exactly the memory-free one;
- precedents: an episode is rendered as the past case's findings, the confirmed answer's text,
  what the agent answered, and the guideline, never as the model's own narrative (its summary
  may be wrong; the gold answer is not);
- review gate: a proposed rule that is only a finding of this case, only an answer's name, that
  names an option by its letter (letters mean nothing in another case) or that teaches a wrong
  option of this case, does not become memory; the reasons are recorded with the reflection.
"""

from __future__ import annotations

import re
from functools import lru_cache

from grandrounds.handlers.agent.protocol import align_reply, explicit_statement, mentioned_options
from grandrounds.handlers.text import content_tokens, key_terms, trigger_overlap

def rule_text(terms: list[str], option_text: str) -> str:
    """A rule as the sim reflector writes it (handlers/backbones/sim.py), and SkeMex's offline distiller:
    the findings that trigger it, then the option text it favours."""
    return f"If the presentation includes {', '.join(terms[:8])}: favour '{option_text}'."


FINDINGS_CHARS = 320
"""How much of a past case's presentation a precedent shows (its key findings come first in a vignette)."""

_QUESTION_TAIL = re.compile(r"\s*(Which|What) of the following[^?]*\?\s*$", re.IGNORECASE)
_LETTER_REF = re.compile(r"(?:\(([A-Z])\)|(?<![A-Za-z0-9'])([A-Z])\)|(?i:\b(?:option|choice|answer)\s+)([A-Z])\b"
                         r"|(?i:\b(?:been|is|was|be)\s+)\(?([A-Z])\)?(?=[.,;:!)]|\s*$))")


def findings_of(question: str, limit: int = FINDINGS_CHARS) -> str:
    """The presentation without the question sentence, cut at a word boundary."""
    return _cut(_QUESTION_TAIL.sub("", question), limit)


GUIDELINE_CHARS = 240
"""Style 2 shows this much of a precedent's guideline: a 1.5 B model's lessons run on, restating the
case; the first sentences carry the lesson."""


def option_note(gold_text: str, options: dict[str, str] | None) -> str:
    """Style 2: where a precedent's confirmed answer stands among this question's options. A small
    model given the text alone weighs it like any finding (measured: it followed a same-diagnosis
    precedent in 19 of 23 held-out cases); given the letter, it can use it."""
    if not options or not gold_text:
        return ""
    want = " ".join(gold_text.lower().split())
    for letter, text in options.items():
        if " ".join(text.lower().split()) == want:
            return f" (option {letter} in this question)"
    return " (not among this question's options)"


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def precedent_line(findings: str, gold_text: str, answer_text: str, correct: bool, guideline: str,
                   name_wrong: bool = False, style: int = 1, options: dict[str, str] | None = None) -> str:
    """`name_wrong`: name the agent's wrong answer. A small model reads a named wrong answer as a
    candidate for this case (measured: it answered that option), so by default it is not named.
    `style` 2 (runs recorded before it: 1): the confirmed answer's option letter in this question
    (`options`), and the guideline's first GUIDELINE_CHARS characters."""
    if not answer_text:
        agent = "the agent gave no valid answer"
    elif correct:
        agent = "the agent answered this too"
    elif name_wrong:
        agent = f"the agent answered {answer_text}, which was wrong"
    else:
        agent = "the agent's answer was wrong"
    if style >= 2:
        line = f"- Past case: {findings} Confirmed answer: {gold_text}{option_note(gold_text, options)} ({agent})."
        guideline = _cut(guideline, GUIDELINE_CHARS) if guideline else ""
    else:
        line = f"- Past case: {findings} Confirmed answer: {gold_text} ({agent})."
    return f"{line} Guideline: {guideline}" if guideline else line


def rule_matches(trigger: list[str], rule_text: str, case_tokens: set[str], floor: float) -> bool:
    """A rule applies when enough of its trigger terms occur in the case; without a trigger, its own
    key terms stand in."""
    terms = _match_terms(tuple(trigger), rule_text)
    return bool(terms) and trigger_overlap(terms, case_tokens) >= floor


@lru_cache(maxsize=4096)
def _match_terms(trigger: tuple[str, ...], rule_text: str) -> tuple[str, ...]:
    """The lower-cased terms a rule matches on: memoised, since rule selection checks up to 32 candidate
    rules a case and the same rules come up case after case (a pure function of the rule's words)."""
    return tuple(t.lower() for t in (trigger or key_terms(rule_text)))


def review_text(text: str, question: str, options: dict[str, str], gold: str) -> str | None:
    """Why `text` (a proposed rule or guideline) must not become memory, or None when it may."""
    norm = " ".join(text.lower().split()).strip(" .")
    if not norm:
        return "empty"
    words = content_tokens(text)
    for k, option in options.items():
        if norm == " ".join(option.lower().split()).strip(" .") or (words and words <= content_tokens(option)):
            return f"only the name of option {k}"
    if _LETTER_REF.search(text) or explicit_statement(text, options):
        return "names an option by its letter"
    named = {k for _, k in mentioned_options(text, options)}
    if named and gold in options and gold not in named:
        return f"teaches option {'/'.join(sorted(named))}, not this case's answer {gold}"
    if norm in " ".join(question.lower().split()) or (words and words <= content_tokens(question) and not named):
        return "only a finding of this case"
    return None


def unconfirmed_lesson(text: str, options: dict[str, str], gold: str) -> str | None:
    """Why a lesson written after a wrong answer must not become memory: it does not settle on the
    confirmed answer (an explicit statement, else the option its last naming sentence names). The
    same model that answered wrongly tends to restate its wrong diagnosis in the lesson."""
    letter, _ = align_reply(text, options)
    if letter == gold:
        return None
    if letter is None:
        return f"a lesson from a wrong answer that does not conclude with the confirmed answer {gold}"
    return f"a lesson from a wrong answer that concludes with option {letter}, not the confirmed answer {gold}"
