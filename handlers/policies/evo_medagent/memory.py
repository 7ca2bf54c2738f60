"""Evo-MedAgent's memory as a projection part: episodes E, rules S, tool records G.

`EvoFold` is the pure fold of the run's events (it reads nothing but the event, so replaying the
log from seq 0 gives what the live path built). `EvoMemory` adds the two cosine indexes retrieval
searches (rules by text, episodes by descriptor); audit folds `EvoFold` alone, which needs no
embedding model. The part is registered for `evo-medagent`, for the `precedent` baseline (which
stores episodes the same way) and for `none` (the memory-free baseline reports the same counts,
all zero, and the tools it was offered).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from grandrounds.handlers.policies.evo_medagent import events as evo
from grandrounds.handlers.text import TermIndex
from grandrounds.store import event_types as ev
from grandrounds.store.events import EventPayload
from grandrounds.store.policy_memory import Embed, register_part
from grandrounds.store.vector_index import VectorIndex


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
class EvoFold:
    rules: dict[str, Rule] = field(default_factory=dict)
    episodes: dict[str, Episode] = field(default_factory=dict)
    tools: dict[str, ToolRecord] = field(default_factory=dict)
    feedback_count: int = 0  # N in the utility's exploration bonus: cases with feedback so far
    rules_added: int = 0
    episodes_added: int = 0

    def active_rules(self) -> list[Rule]:
        return [r for r in self.rules.values() if r.status == "active"]

    def fold(self, seq: int, payload: EventPayload) -> None:
        handler = _FOLD.get(type(payload))
        if handler is not None:
            handler(self, seq, payload)

    def counts(self) -> dict[str, Any]:
        active = self.active_rules()
        labels = {"Trusted": 0, "Caution": 0, "Avoid": 0}
        for t in self.tools.values():
            labels[t.label] += 1
        return {
            "episodes": len(self.episodes),
            "rules": len(active),
            "rules_by_priority": {str(p): sum(1 for r in active if r.priority == p) for p in (0, 1, 2)},
            "rules_retired": sum(1 for r in self.rules.values() if r.status == "retired"),
            "tools": {name: self.tools[name].label for name in sorted(self.tools)},
            "tool_labels": labels,
        }

    # --- per event type --------------------------------------------------------------

    def _run_started(self, seq: int, e: ev.RunStarted) -> None:
        for name in sorted(e.tools):
            self.tools.setdefault(name, ToolRecord(name))

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

    def _episode(self, seq: int, e: evo.EpisodeStored) -> None:
        self.episodes[e.episode_id] = Episode(
            e.episode_id, e.case_id, e.descriptor, e.summary, e.guideline, list(e.trigger),
            e.answer, e.gold, e.correct, seq, e.answer_text, e.gold_text)
        self.episodes_added += 1

    def _rule_added(self, seq: int, e: evo.RuleAdded) -> None:
        self.rules[e.rule_id] = Rule(e.rule_id, e.text, list(e.trigger), e.priority, e.source_case_id, seq,
                                     derived_from=[e.source_case_id])
        self.rules_added += 1

    def _rule_edited(self, seq: int, e: evo.RuleEdited) -> None:
        rule = self.rules[e.rule_id]
        rule.text = e.text
        rule.trigger = list(e.trigger)
        rule.edits += 1
        if e.source_case_id not in rule.derived_from:
            rule.derived_from.append(e.source_case_id)

    def _rule_priority(self, seq: int, e: evo.RulePriorityChanged) -> None:
        rule = self.rules[e.rule_id]
        rule.priority = e.new
        if e.source_case_id not in rule.derived_from:
            rule.derived_from.append(e.source_case_id)

    def _rule_retired(self, seq: int, e: evo.RuleRetired) -> None:
        self.rules[e.rule_id].status = "retired"

    def _tool_label(self, seq: int, e: evo.ToolLabelChanged) -> None:
        self.tools.setdefault(e.tool, ToolRecord(e.tool)).label = e.new


_FOLD = {
    ev.RunStarted: EvoFold._run_started,
    ev.FeedbackRecorded: EvoFold._feedback,
    evo.EpisodeStored: EvoFold._episode,
    evo.RuleAdded: EvoFold._rule_added,
    evo.RuleEdited: EvoFold._rule_edited,
    evo.RulePriorityChanged: EvoFold._rule_priority,
    evo.RuleRetired: EvoFold._rule_retired,
    evo.ToolLabelChanged: EvoFold._tool_label,
}

MEMORY_TYPES = ("run.started", "feedback.recorded") + tuple(
    cls.event_type for cls in _FOLD if cls not in (ev.RunStarted, ev.FeedbackRecorded))
"""The event types the fold reads (audit filters the log to these)."""


@dataclass(eq=False)
class EvoMemory(EvoFold):
    """The fold plus the indexes retrieval searches; equality (rebuild vs live) is the fold's."""

    _checkpoint_skip = ("_terms",)  # the BM25 index is derived from `episodes` when first needed

    dim: int = 0
    exact_limit: int = 4096
    rule_index: VectorIndex = field(default=None)  # type: ignore[assignment]
    episode_index: VectorIndex = field(default=None)  # type: ignore[assignment]
    rule_labels: dict[str, int] = field(default_factory=dict)
    rule_by_label: dict[int, str] = field(default_factory=dict)
    episode_by_label: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rule_index is None:
            self.rule_index = VectorIndex(self.dim, exact_limit=self.exact_limit)
        if self.episode_index is None:
            self.episode_index = VectorIndex(self.dim, exact_limit=self.exact_limit)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EvoMemory):
            return NotImplemented
        mine = (self.rules, self.episodes, self.tools, self.feedback_count, self.rules_added,
                self.episodes_added, self.rule_labels, self.rule_by_label, self.episode_by_label)
        theirs = (other.rules, other.episodes, other.tools, other.feedback_count, other.rules_added,
                  other.episodes_added, other.rule_labels, other.rule_by_label, other.episode_by_label)
        return mine == theirs

    __hash__ = None  # type: ignore[assignment]

    def apply(self, seq: int, payload: EventPayload, embed: Embed) -> None:
        self.fold(seq, payload)
        # Index maintenance after the state change, from the same event, in event order (labels
        # are assigned in insertion order, which keeps search results a function of the log).
        if isinstance(payload, evo.RuleAdded):
            self._index_rule(payload.rule_id, payload.text, embed)
        elif isinstance(payload, evo.RuleEdited):
            self.rule_index.remove(self.rule_labels.pop(payload.rule_id))
            self._index_rule(payload.rule_id, payload.text, embed)
        elif isinstance(payload, evo.RuleRetired):
            label = self.rule_labels.pop(payload.rule_id, None)
            if label is not None:
                self.rule_index.remove(label)
        elif isinstance(payload, evo.EpisodeStored):
            label = self.episode_index.add(embed(payload.descriptor))
            self.episode_by_label[label] = payload.episode_id

    def term_index(self) -> TermIndex:
        """BM25 over the episodes' case texts (re-ranks the nearest episodes: handlers/text.py). Derived
        from `episodes` when first needed and kept in step (episodes are only ever added), so no
        checkpoint holds it and every way of restoring memory gets the same index."""
        index: TermIndex | None = getattr(self, "_terms", None)
        if index is None:
            index = self._terms = TermIndex()
        missing = len(self.episodes) - len(index)
        if missing:  # the new ones are the last (insertion order)
            # Walked from the end: skipping the indexed ones from the front cost a step per episode
            # held, every case (0.18 ms at 5,000 episodes, growing with memory).
            new = list(islice(reversed(self.episodes.values()), missing))
            for ep in reversed(new):
                index.add(ep.episode_id, ep.descriptor)
        return index

    def nearest_episodes(self, query, own: frozenset[str] | set[str], floor: float, k: int,
                         rerank: int = 0, rerank_text: str | None = None) -> list[tuple[Episode, float]]:
        """The k nearest episodes by cosine at or above `floor`, skipping those derived from `own` (the
        leakage guard): (episode, cosine) tuples. With `rerank` > 0 (and `rerank_text`), the nearest
        `rerank` are re-ordered by BM25 over that text's findings first (ties keep the cosine order).
        Shared by evo-medagent's episodes and the precedent baseline."""
        rerank = rerank if rerank_text is not None else 0
        pool = max(k, rerank)
        out = []
        for label, relevance in self.episode_index.search(query, pool + len(own)):
            ep = self.episodes[self.episode_by_label[label]]
            if ep.case_id not in own and relevance >= floor:
                out.append((ep, relevance))
        out = out[:pool]
        if rerank:
            scores = self.term_index().scores(rerank_text, [ep.episode_id for ep, _ in out])
            out = [out[i] for i in sorted(range(len(out)), key=lambda i: (-scores[i], i))]
        return out[:k]

    def _index_rule(self, rule_id: str, text: str, embed: Embed) -> None:
        label = self.rule_index.add(embed(text))
        self.rule_labels[rule_id] = label
        self.rule_by_label[label] = rule_id


def new_part(dim: int, exact_limit: int) -> EvoMemory:
    return EvoMemory(dim=dim, exact_limit=exact_limit)


for _name in ("evo-medagent", "precedent", "none"):
    # `none` keeps the episodes part (its run summary counts an empty memory) but never retrieves
    register_part(_name, new_part, retrieves=_name != "none")
