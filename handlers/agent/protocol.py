"""The SkeMex agent protocol: `<reasoning>` then exactly one `<tool>{json}</tool>` or `<response>`.

`parse_turn` never raises: a turn that breaks the protocol comes back as kind `invalid`
with the corrective observation the model is shown next (SkeMex appendix A.2).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

BASE_PROTOCOL = (
    "You are a clinical reasoning agent. Read the case, weigh the evidence, use tools only "
    "as their governance label allows, and answer with exactly one option letter."
)
"""The first line of every memory prefix (handlers/policies/render.py) and of the FHIR agent's memory block."""

_TAG = {name: re.compile(rf"<{name}>(.*?)</{name}>", re.DOTALL | re.IGNORECASE)
        for name in ("reasoning", "tool", "response")}
_ANY_TAG = re.compile(r"</?(planning|reasoning|tool|response)>", re.IGNORECASE)
_LETTER = re.compile(r"^\s*(?:answer\s*[:\-]?\s*)?\(?([A-Z])\)?(?:[\s.):,-]|$)", re.IGNORECASE)
_ANSWER_IS = re.compile(r"\banswer\s*(?:is)?\s*[:\-]?\s*\(?([A-Z])\b(?![a-z])")


@dataclass(frozen=True)
class Turn:
    kind: Literal["tool", "response", "invalid"]
    reasoning: str
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    answer: str | None = None
    error: str | None = None
    """For `invalid`: the corrective observation."""
    alignment: str | None = None
    """For `response`: how the letter was read (`tag`: inside <response>; `statement`: an explicit
    answer statement outside the tags; `conclusion`: no tags, the option the reply concludes with;
    `schema`: the constrained JSON action)."""

    @property
    def signature(self) -> str | None:
        """The exact action, for loop detection: same tool with the same input."""
        if self.kind != "tool":
            return None
        return f"{self.tool}:{json.dumps(self.arguments, sort_keys=True)}"


def align_answer(text: str, options: dict[str, str]) -> str | None:
    """Map the content of a `<response>` to an option letter: a leading letter, an "answer is X"
    statement, or exactly one option's full text. Several option texts and no letter: no answer."""
    m = _LETTER.match(text.strip())
    if m and m.group(1).upper() in options:
        return m.group(1).upper()
    m = _ANSWER_IS.search(text)
    if m and m.group(1).upper() in options:
        return m.group(1).upper()
    named = mentioned_options(text, options)
    return named[0][1] if len({k for _, k in named}) == 1 else None


# --- aligning a reply that broke the protocol ---------------------------------------------------
# What the model itself concluded, never a guess: (1) the last explicit answer statement
# ("Answer: C", "[Response] E", "the correct option is (B)"), else (2) the option the reply
# concludes with (the last sentence naming an option, if it names exactly one), else no answer.

_STATEMENT = re.compile(
    r"(?:(?i:\b(?:final\s+)?answer(?:\s+is)?|\bresponse|\b(?:correct|best|right)\s+(?:option|choice|answer)"
    r"(?:\s+is)?|\b(?:i\s+)?(?:choose|select|pick)(?:\s+option)?))"
    r"\s*[:=\]\-]?\s*(?i:option\s+)?[\[\(\*\s]*([A-Z])(?![A-Za-z0-9])")
_LETTER_MENTION = re.compile(r"(?:\(([A-Z])\)|(?<![A-Za-z0-9])([A-Z])\)|(?i:\boption\s+)([A-Z])(?![A-Za-z0-9])"
                             r"|\*\*([A-Z])[.):\s*])")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")

Alignment = Literal["statement", "conclusion"]


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[*_`]", " ", text).lower().split())


_norm_option = lru_cache(maxsize=4096)(_norm)
"""`_norm` memoised for option texts: a case's options are normalised again by every check that looks
for them in a text (the review gate checks each proposed rule and guideline, and the lesson's sentences
one by one), while the option texts themselves never change."""


def mentioned_options(text: str, options: dict[str, str]) -> list[tuple[int, str]]:
    """(position, letter) of every option named in `text`, by its letter ("C)", "(C)", "option C")
    or its full text; a text mention inside a longer option's mention does not count."""
    found: list[tuple[int, str]] = []
    for m in _LETTER_MENTION.finditer(text):
        letter = next(g for g in m.groups() if g)
        if letter in options:
            found.append((m.start(), letter))
    low = _norm(text)
    spans: list[tuple[int, int, str]] = []
    for k, t in options.items():
        needle = _norm_option(t)
        if not needle:
            continue
        start = low.find(needle)
        while start >= 0:
            spans.append((start, start + len(needle), k))
            start = low.find(needle, start + 1)
    for s, e, k in spans:
        if not any(s2 <= s and e <= e2 and (e2 - s2) > (e - s) for s2, e2, _ in spans):
            found.append((s, k))  # position in the normalised text: only compared within one sentence
    return sorted(found)


_MARKUP = re.compile(r"</?[A-Za-z]+>|[*_`#]")
_OPTION_LINE = re.compile(r"^\s*(?:(?i:option|choice)\s+)?\(?([A-Z])\)?\s*[:.)\-]?\s*(.*?)\s*[.!]?\s*$")


def _option_line(line: str, options: dict[str, str]) -> str | None:
    """A line that is nothing but one option, its letter with its own text ("Option C: Acute
    pericarditis", "**B) Tension pneumothorax**"): the model stating its choice."""
    m = _OPTION_LINE.match(_MARKUP.sub(" ", line))
    if not m or m.group(1) not in options:
        return None
    rest = " ".join(m.group(2).lower().split())
    return m.group(1) if rest == " ".join(options[m.group(1)].lower().split()) else None


def explicit_statement(text: str, options: dict[str, str]) -> str | None:
    """The letter of the reply's last explicit answer statement ("Answer: C", "[Response] E", a line
    that is only one option's letter and text), if it names an option."""
    found = [(m.start(), m.group(1)) for m in _STATEMENT.finditer(text) if m.group(1) in options]
    pos = 0
    for line in text.splitlines(keepends=True):
        letter = _option_line(line, options)
        if letter is not None:
            found.append((pos, letter))
        pos += len(line)
    return max(found)[1] if found else None


def concluded_option(text: str, options: dict[str, str]) -> str | None:
    """The option named by the last sentence that names any; None when that sentence names several."""
    for sentence in reversed([s for s in _SENTENCE_END.split(text) if s.strip()]):
        named = {k for _, k in mentioned_options(sentence, options)}
        if named:
            return named.pop() if len(named) == 1 else None
    return None


def align_reply(text: str, options: dict[str, str]) -> tuple[str, Alignment] | tuple[None, None]:
    """The option a free-text reply settles on, and which rule found it."""
    letter = explicit_statement(text, options)
    if letter is not None:
        return letter, "statement"
    letter = concluded_option(text, options)
    if letter is not None:
        return letter, "conclusion"
    return None, None


def parse_turn(text: str, options: dict[str, str], tools: list[str], tools_allowed: bool = True) -> Turn:
    reasoning = " ".join(m.strip() for m in _TAG["reasoning"].findall(text))
    tools_found = _TAG["tool"].findall(text)
    responses = _TAG["response"].findall(text)
    letters = ", ".join(options)
    example = f"<response>{next(iter(options), 'A')}</response>"
    if len(tools_found) + len(responses) == 0:
        letter, rule = align_reply(_ANY_TAG.sub(" ", text), options)
        if letter is not None:  # "Answer: C", "[Response] E", "... so B) X." without the tags: its own answer
            return Turn("response", reasoning or text, answer=letter, alignment=rule)
        return Turn("invalid", reasoning, error=(
            "Format error: missing action. After <reasoning>...</reasoning> give exactly one "
            f"<tool>{{\"name\": ..., \"arguments\": {{}}}}</tool> or a response with one option letter "
            f"({letters}), for example {example}."))
    if len(tools_found) + len(responses) > 1:
        return Turn("invalid", reasoning, error=(
            f"Format error: exactly one action per turn (one <tool> or one <response> with one of {letters})."))
    if responses:
        letter = align_answer(responses[0], options)
        if letter is None:
            return Turn("invalid", reasoning, error=(
                f"Format error: <response> must hold exactly one option letter ({letters}), for example {example}."))
        return Turn("response", reasoning, answer=letter, alignment="tag")
    if not tools_allowed:
        return Turn("invalid", reasoning, error=(
            f"Tools are disabled on the final step: answer with one option letter ({letters}), for example {example}."))
    try:
        data = json.loads(tools_found[0])
    except json.JSONDecodeError as exc:
        return Turn("invalid", reasoning, error=f"Parse error: the <tool> block is not valid JSON ({exc.msg} at column {exc.colno}).")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return Turn("invalid", reasoning, error='Parse error: the <tool> JSON must be {"name": "<tool>", "arguments": {...}}.')
    args = data.get("arguments", {})
    if not isinstance(args, dict):
        return Turn("invalid", reasoning, error='Parse error: "arguments" must be a JSON object.')
    if data["name"] not in tools:
        avail = ", ".join(tools) if tools else f"none (answer with one option letter: {letters})"
        return Turn("invalid", reasoning, error=f"Tool error: unknown tool {data['name']!r}; available: {avail}.")
    return Turn("tool", reasoning, tool=data["name"], arguments=args)


def fallback_answer(text: str, options: dict[str, str]) -> str | None:
    """Last step, protocol still broken: strip the structural tags and align what remains."""
    return fallback_alignment(text, options)[0]


def fallback_alignment(text: str, options: dict[str, str]) -> tuple[str, Alignment] | tuple[None, None]:
    """`fallback_answer` with the rule that produced it (`statement` or `conclusion`)."""
    return align_reply(_ANY_TAG.sub(" ", text).strip(), options)


def stated_answer(letter: str, options: dict[str, str]) -> str:
    """An answer as prompts show it: "B) text", or that the agent gave none."""
    return f"{letter}) {options[letter]}" if letter in options else "no valid answer (graded wrong)"
