"""The SkeMex agent protocol: `<reasoning>` then exactly one `<tool>{json}</tool>` or `<response>`.

`parse_turn` never raises: a turn that breaks the protocol comes back as kind `invalid`
with the corrective observation the model is shown next (SkeMex appendix A.2).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

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

    @property
    def signature(self) -> str | None:
        """The exact action, for loop detection: same tool with the same input."""
        if self.kind != "tool":
            return None
        return f"{self.tool}:{json.dumps(self.arguments, sort_keys=True)}"


def align_answer(text: str, options: dict[str, str]) -> str | None:
    """Map a free-text answer to an option letter: a leading letter, or an option's full text."""
    m = _LETTER.match(text.strip())
    if m and m.group(1).upper() in options:
        return m.group(1).upper()
    m = _ANSWER_IS.search(text)
    if m and m.group(1).upper() in options:
        return m.group(1).upper()
    low = " ".join(text.lower().split())
    hits = sorted((len(t), k) for k, t in options.items() if " ".join(t.lower().split()) in low)
    return hits[-1][1] if hits else None


def parse_turn(text: str, options: dict[str, str], tools: list[str], tools_allowed: bool = True) -> Turn:
    reasoning = " ".join(m.strip() for m in _TAG["reasoning"].findall(text))
    tools_found = _TAG["tool"].findall(text)
    responses = _TAG["response"].findall(text)
    letters = ", ".join(options)
    if len(tools_found) + len(responses) == 0:
        return Turn("invalid", reasoning, error=(
            "Format error: missing action. After <reasoning>...</reasoning> give exactly one "
            "<tool>{\"name\": ..., \"arguments\": {...}}</tool> or <response>LETTER</response>."))
    if len(tools_found) + len(responses) > 1:
        return Turn("invalid", reasoning, error="Format error: exactly one action per turn (one <tool> or one <response>).")
    if responses:
        letter = align_answer(responses[0], options)
        if letter is None:
            return Turn("invalid", reasoning, error=f"Format error: <response> must be exactly one option letter ({letters}).")
        return Turn("response", reasoning, answer=letter)
    if not tools_allowed:
        return Turn("invalid", reasoning, error="Tools are disabled on the final step: give <response>LETTER</response>.")
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
        avail = ", ".join(tools) if tools else "none (answer with <response>)"
        return Turn("invalid", reasoning, error=f"Tool error: unknown tool {data['name']!r}; available: {avail}.")
    return Turn("tool", reasoning, tool=data["name"], arguments=args)


def fallback_answer(text: str, options: dict[str, str]) -> str | None:
    """Last step, protocol still broken: strip the structural tags and align what remains."""
    return align_answer(_ANY_TAG.sub(" ", text).strip(), options)
