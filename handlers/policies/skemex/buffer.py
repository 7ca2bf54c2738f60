"""The learning buffer (SkeMex §3.4): which finished trajectories are worth distilling.

Every trajectory enters the open window (its adoption evidence feeds the utility update),
but only informative ones are retained for writing. Dropped: simple successes (reward 1
within `simple_success_steps` agent turns), loops (the same action `loop_repeats` times in
a row), max-step failures, and infrastructure errors. When the window closes, at most
`buffer_capacity` retained trajectories are distilled: failures first (they carry the
most to learn), then longer trajectories, then arrival order.
"""

from __future__ import annotations

from grandrounds.handlers.policies.skemex.config import SkeMexPolicy
from grandrounds.store.event_types import AgentStep, AnswerGiven
from grandrounds.handlers.policies.skemex.events import Adoption, TrajectoryRecorded

INFRA_MARKERS = ("error:", "unavailable", "timed out", "timeout", "connection refused", "internal server error")
"""Observation text of a tool/service failure (not the agent's own format errors)."""


def turns(steps: list[AgentStep]) -> int:
    """Agent turns: one per observation (a tool call or a corrected invalid action) plus the answer."""
    return sum(1 for s in steps if s.kind == "observation") + 1


def longest_repeat(steps: list[AgentStep]) -> int:
    """The longest run of identical consecutive actions (tool calls with the same arguments)."""
    best = run = 0
    last = None
    for s in steps:
        if s.kind != "tool":
            continue
        run = run + 1 if s.content == last else 1
        last = s.content
        best = max(best, run)
    return best


def drop_reason(answer: AnswerGiven, reward: float, cfg: SkeMexPolicy) -> str | None:
    """Why the buffer drops this trajectory, or None when it keeps it."""
    if any(s.kind == "observation" and any(m in s.content.lower() for m in INFRA_MARKERS) for s in answer.steps):
        return "infra-error"
    if longest_repeat(answer.steps) >= cfg.loop_repeats:
        return "loop"
    n = turns(answer.steps)
    if reward < 1.0 and (n >= cfg.max_steps or ":fallback" in answer.source):
        return "max-steps"
    if reward >= 1.0 and n <= cfg.simple_success_steps:
        return "simple-success"
    return None


def adopted_ids(answer: AnswerGiven, injected: list[str]) -> set[str]:
    """Injected skills the agent acted on: the answer's source (`skill:<id>`, the sim) or the
    skill id cited in its reasoning (the prompt asks the model to cite ids it follows)."""
    out = {i for i in injected if answer.source == f"skill:{i}"}
    text = " ".join(s.content for s in answer.steps if s.kind in ("reasoning", "response"))
    out |= {i for i in injected if i in text}
    return out


def heuristic_labels(answer: AnswerGiven, injected: list[str], reward: float) -> dict[str, Adoption]:
    adopted = adopted_ids(answer, injected)
    return {i: ("adopted+" if reward >= 1.0 else "adopted-") if i in adopted else "ignored" for i in injected}


def informativeness(t: TrajectoryRecorded) -> tuple:
    """Sort key: failures first, then more turns, then arrival (the caller's order)."""
    return (t.reward >= 1.0, -t.turns)


def to_distil(buffer: list[TrajectoryRecorded], cfg: SkeMexPolicy) -> tuple[list[TrajectoryRecorded], list[str]]:
    """(retained trajectories to distil, in arrival order; case ids over capacity)."""
    retained = [(i, t) for i, t in enumerate(buffer) if t.retained]
    ranked = sorted(retained, key=lambda it: (*informativeness(it[1]), it[0]))
    keep = sorted(ranked[: cfg.buffer_capacity])
    over = [t.case_id for _, t in sorted(ranked[cfg.buffer_capacity:])]
    return [t for _, t in keep], over
