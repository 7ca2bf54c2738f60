"""Memory state as a pure fold over a run's events.

`MemoryState.apply` is the only way state changes, and it reads nothing but the event:
replaying the log from seq 0 gives exactly the state the live path built incrementally.
Decisions (utility, labels, which edit to make) are taken by handlers and arrive here
already made, as events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grandrounds.store import event_types as ev
from grandrounds.store.events import EventPayload


@dataclass
class Rule:
    rule_id: str
    text: str
    trigger: list[str]
    priority: int
    source_case_id: str
    created_seq: int
    status: str = "active"  # active | retired
    derived_from: list[str] = field(default_factory=list)
    """Cases whose reflection created or changed this rule (the leakage guard reads it)."""
    selected: int = 0
    helpful: int = 0
    harmful: int = 0
    edits: int = 0


@dataclass
class Episode:
    episode_id: str
    case_id: str
    descriptor: str
    summary: str
    guideline: str
    trigger: list[str]
    answer: str
    gold: str
    correct: bool
    created_seq: int
    answer_text: str = ""
    gold_text: str = ""


@dataclass
class ToolRecord:
    name: str
    label: str = "Caution"
    helpful: int = 0
    harmful: int = 0
    misuse: int = 0
    total: int = 0


@dataclass
class MemoryState:
    rules: dict[str, Rule] = field(default_factory=dict)
    episodes: dict[str, Episode] = field(default_factory=dict)
    tools: dict[str, ToolRecord] = field(default_factory=dict)
    feedback_count: int = 0  # N in the utility's exploration bonus: cases with feedback so far
    cases_received: int = 0
    cases_completed: int = 0
    correct: int = 0
    rules_added: int = 0
    episodes_added: int = 0
    last_seq: int = -1
    declared_cases: int | None = None
    """The case count `run.started` declared (None for runs written before runs declared it)."""
    run_completed: bool = False
    policy_memory: Any = None
    """The part holding another policy's memory (store/policy_memory.py); the projection folds it."""

    def active_rules(self) -> list[Rule]:
        return [r for r in self.rules.values() if r.status == "active"]

    def apply(self, seq: int, payload: EventPayload) -> None:
        handler = _FOLD.get(type(payload))
        if handler is not None:
            handler(self, seq, payload)
        self.last_seq = seq

    # --- per event type --------------------------------------------------------------

    def _run_started(self, seq: int, e: ev.RunStarted) -> None:
        self.declared_cases = e.cases
        for name in sorted(e.tools):
            self.tools.setdefault(name, ToolRecord(name))

    def _case_received(self, seq: int, e: ev.CaseReceived) -> None:
        self.cases_received += 1

    def _feedback(self, seq: int, e: ev.FeedbackRecorded) -> None:
        self.feedback_count += 1
        for o in e.rule_outcomes:
            rule = self.rules.get(o.rule_id)
            if rule is None:
                continue
            rule.selected += 1
            if o.helpful:
                rule.helpful += 1
            else:
                rule.harmful += 1
        for t in e.tool_outcomes:
            rec = self.tools.setdefault(t.tool, ToolRecord(t.tool))
            rec.total += 1
            if t.outcome == "helpful":
                rec.helpful += 1
            elif t.outcome == "harmful":
                rec.harmful += 1
            elif t.outcome == "misuse":
                rec.misuse += 1

    def _episode(self, seq: int, e: ev.EpisodeStored) -> None:
        self.episodes[e.episode_id] = Episode(
            e.episode_id, e.case_id, e.descriptor, e.summary, e.guideline, list(e.trigger),
            e.answer, e.gold, e.correct, seq, e.answer_text, e.gold_text)
        self.episodes_added += 1

    def _rule_added(self, seq: int, e: ev.RuleAdded) -> None:
        self.rules[e.rule_id] = Rule(e.rule_id, e.text, list(e.trigger), e.priority, e.source_case_id, seq,
                                     derived_from=[e.source_case_id])
        self.rules_added += 1

    def _rule_edited(self, seq: int, e: ev.RuleEdited) -> None:
        rule = self.rules[e.rule_id]
        rule.text = e.text
        rule.trigger = list(e.trigger)
        rule.edits += 1
        if e.source_case_id not in rule.derived_from:
            rule.derived_from.append(e.source_case_id)

    def _rule_priority(self, seq: int, e: ev.RulePriorityChanged) -> None:
        rule = self.rules[e.rule_id]
        rule.priority = e.new
        if e.source_case_id not in rule.derived_from:
            rule.derived_from.append(e.source_case_id)

    def _rule_retired(self, seq: int, e: ev.RuleRetired) -> None:
        self.rules[e.rule_id].status = "retired"

    def _tool_label(self, seq: int, e: ev.ToolLabelChanged) -> None:
        self.tools.setdefault(e.tool, ToolRecord(e.tool)).label = e.new

    def _case_completed(self, seq: int, e: ev.CaseCompleted) -> None:
        self.cases_completed += 1
        self.correct += int(e.correct)

    def _run_completed(self, seq: int, e: ev.RunCompleted) -> None:
        self.run_completed = True

    @property
    def completes_run(self) -> bool:
        """Whether the run has just completed its last declared case and not yet said so."""
        return (self.declared_cases is not None and not self.run_completed
                and self.cases_completed >= self.declared_cases)

    def counts(self) -> dict:
        """Memory counts for run summaries."""
        active = self.active_rules()
        by_priority = {str(p): sum(1 for r in active if r.priority == p) for p in (0, 1, 2)}
        labels = {"Trusted": 0, "Caution": 0, "Avoid": 0}
        for t in self.tools.values():
            labels[t.label] += 1
        out = {
            "episodes": len(self.episodes),
            "rules": len(active),
            "rules_by_priority": by_priority,
            "rules_retired": sum(1 for r in self.rules.values() if r.status == "retired"),
            "tools": {name: self.tools[name].label for name in sorted(self.tools)},
            "tool_labels": labels,
        }
        if self.policy_memory is not None:
            out.update(self.policy_memory.counts())
        return out


_FOLD = {
    ev.RunStarted: MemoryState._run_started,
    ev.CaseReceived: MemoryState._case_received,
    ev.FeedbackRecorded: MemoryState._feedback,
    ev.EpisodeStored: MemoryState._episode,
    ev.RuleAdded: MemoryState._rule_added,
    ev.RuleEdited: MemoryState._rule_edited,
    ev.RulePriorityChanged: MemoryState._rule_priority,
    ev.RuleRetired: MemoryState._rule_retired,
    ev.ToolLabelChanged: MemoryState._tool_label,
    ev.CaseCompleted: MemoryState._case_completed,
    ev.RunCompleted: MemoryState._run_completed,
}
