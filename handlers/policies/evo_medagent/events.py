"""Events of Evo-MedAgent's memory (seed 003; DESIGN §6): episodes, procedural rules, tool labels.

Decisions (which edit, which label) are taken by handlers/policies/evo_medagent/policy.py and
arrive here made; handlers/policies/evo_medagent/memory.py folds them. The type names, versions and
fields are exactly those the store used to define, so logs written before the move decode (and
fingerprint) byte for byte the same. `episode.stored` is also the memory of the `precedent`
baseline, which stores whole cases the same way.
"""

from __future__ import annotations

from typing import ClassVar

from grandrounds.store.event_types import Priority, ToolLabel
from grandrounds.store.events import EventPayload, GrowingPayload, event


@event("episode.stored")
class EpisodeStored(GrowingPayload):
    carries_memory: ClassVar[bool] = True
    episode_id: str
    case_id: str
    descriptor: str
    trace: list[str]
    answer: str
    gold: str
    correct: bool
    summary: str
    guideline: str
    trigger: list[str]
    answer_text: str = ""
    """MCQ: the text of the option the agent chose ("" when it gave none): precedents show texts,
    since letters are shuffled between cases."""
    gold_text: str = ""
    """MCQ: the text of the confirmed answer."""

    omit_if_default: ClassVar[frozenset[str]] = frozenset({"answer_text", "gold_text"})


@event("rule.added")
class RuleAdded(EventPayload):
    carries_memory: ClassVar[bool] = True
    rule_id: str
    text: str
    trigger: list[str]
    priority: Priority
    source_case_id: str


@event("rule.edited")
class RuleEdited(EventPayload):
    carries_memory: ClassVar[bool] = True
    rule_id: str
    text: str
    trigger: list[str]
    source_case_id: str
    reason: str = ""


@event("rule.priority_changed")
class RulePriorityChanged(EventPayload):
    carries_memory: ClassVar[bool] = True
    rule_id: str
    old: Priority
    new: Priority
    source_case_id: str
    reason: str = ""


@event("rule.retired")
class RuleRetired(EventPayload):
    carries_memory: ClassVar[bool] = True
    rule_id: str
    source_case_id: str
    reason: str = ""


@event("tool.label_changed")
class ToolLabelChanged(EventPayload):
    carries_memory: ClassVar[bool] = True
    tool: str
    old: ToolLabel
    new: ToolLabel
    n: int
    helpful: int
    harmful: int
    misuse: int
