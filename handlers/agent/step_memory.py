"""What an agent loop gives and takes of per-step memory: the state it retrieves with, and the hook.

The agent loops (react, fhir_react, fhir_official) call a policy's step retrieval through this contract
and nothing else of the policies, which sit above them (handlers/policies/base.py re-exports it).
"""

from __future__ import annotations

from typing import Callable

from grandrounds.store.event_types import AgentStep, MemoryItem

StepMemory = Callable[[str], list[MemoryItem]]
"""Per-step retrieval: the agent's current state (`agent_state`) -> the items to inject
before its next decision. Must be a pure function of the state and the memory version the
case started from."""

SUMMARISER = "summariser"
"""`MemoryItem.detail["audience"]` of items meant for the RetroSum summariser, not the actor."""


def agent_state(question: str, transitions: list[tuple[str, str]]) -> str:
    """SELSM's trajectory state s_t = s_{t-1} ⊕ F(t, a_t, o_t), as text: the query, then one
    line per step taken so far (action and observation). Both agent loops build it this way."""
    lines = [question.strip()]
    lines += [f"step {t}: {action} -> {observation}" for t, (action, observation) in enumerate(transitions, 1)]
    return "\n".join(lines)


def step_guidance(items: list[MemoryItem]) -> str:
    return "\n\n## Guidance for this step\n" + "\n".join(f"- {i.text}" for i in items) if items else ""


def recall_step(step_memory: StepMemory | None, question: str, transitions: list[tuple[str, str]],
                steps: list[AgentStep]) -> str:
    """SELSM's retrieval before a decision: the items for the state so far, recorded by id as a
    `memory` step of the trajectory; returns the guidance block the next prompt adds ("" without
    step memory, or when nothing was retrieved)."""
    if step_memory is None:
        return ""
    items = step_memory(agent_state(question, transitions))
    steps.append(AgentStep(kind="memory", content=",".join(i.item_id for i in items)))
    return step_guidance(items)
