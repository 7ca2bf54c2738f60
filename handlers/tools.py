"""Simulated tools of fixed, seeded reliability: the environment side of tool governance.

A tool is an environment component (think of a classifier whose accuracy is known), so it
is built from the full case; the acting agent only ever sees `ToolBox.call`'s output.
A call returns the correct option with probability r. Otherwise the tool fails, and how it
fails also follows its reliability: a good tool mostly fails loudly (no result, prob. r),
a poor one mostly confabulates a wrong option (prob. 1 − r). So P(wrong) = (1 − r)².
That is the behaviour governance has to learn: a 0.95 tool almost never misleads, a 0.1
tool misleads on ~81 % of calls.
"""

from __future__ import annotations

from grandrounds.handlers.cases import Case
from grandrounds.handlers.randomness import case_rng


def parse_tool_spec(spec: str) -> tuple[str, float]:
    """`name=reliability`, reliability in [0, 1]."""
    name, sep, value = spec.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"tool {spec!r}: expected NAME=RELIABILITY, e.g. ddx-lookup=0.9")
    try:
        r = float(value)
    except ValueError:
        raise ValueError(f"tool {spec!r}: reliability {value!r} is not a number") from None
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"tool {spec!r}: reliability must be between 0 and 1")
    return name.strip(), r


class ToolBox:
    """The tools a case may use, with outputs fixed by (run seed, case, tool)."""

    def __init__(self, case: Case, tools: dict[str, float], seed: int):
        self._case = case
        self._tools = tools
        self._seed = seed
        wanted = case.tools or sorted(tools)
        self.names: list[str] = [t for t in wanted if t in tools]

    def call(self, name: str) -> str | None:
        if name not in self.names:
            raise KeyError(f"tool {name!r} is not available for case {self._case.case_id}")
        r = self._tools[name]
        rng = case_rng(self._seed, self._case.case_id, f"tool:{name}")
        if rng.random() < r:
            return self._case.answer
        if rng.random() < r:
            return None
        wrong = [k for k in self._case.options if k != self._case.answer]
        return wrong[int(rng.integers(len(wrong)))]
