"""What every audit query shares: input errors, case lookups, memory folded up to a seq.

Audit reads the log, never a live projection: the memory "as it was" at seq S is the fold
of the run's events up to S. Only the event types that change memory are read (SQL filters
out case payloads, retrieval prefixes and reflections), which keeps a fold of a
2,500-case run well under a second; the folds themselves are `MemoryState.apply` and Evo-MedAgent's
`EvoFold.fold`, the ones used live, so audit cannot disagree with what the run saw.
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
from dataclasses import dataclass, field

from grandrounds.handlers.policies.config import EvoMedAgentPolicy, PolicyConfig
from grandrounds.handlers.policies.evo_medagent import memory as evo_memory
from grandrounds.handlers.policies.evo_medagent.memory import EvoFold, Rule
from grandrounds.handlers.policies.evo_medagent.policy import rule_utility
from grandrounds.replay.caselog import require_spec
from grandrounds.store.eventstore import EventStore
from grandrounds.store.read_model import EventLog
from grandrounds.store.memory_state import MemoryState

MEMORY_TYPES = (*evo_memory.MEMORY_TYPES, "case.completed")
"""The event types audit folds (`case.received` only counts)."""


@dataclass
class AuditMemory(EvoFold):
    """Evo-MedAgent's three stores (empty but for tools under the other policies, whose own items
    audit reads from their projection part) with the run's case counts, without any index: audit
    needs no embedding model."""

    common: MemoryState = field(default_factory=MemoryState)

    def apply(self, seq: int, payload) -> None:
        self.common.apply(seq, payload)
        self.fold(seq, payload)

    @property
    def cases_completed(self) -> int:
        return self.common.cases_completed

    @property
    def correct(self) -> int:
        return self.common.correct


class AuditInputError(InvalidInput, ValueError):
    """A bad audit request: unknown item or case, an as-of point outside the run (exit code 2)."""


@dataclass(frozen=True)
class AsOf:
    seq: int
    """The last seq folded."""
    case_index: int | None
    """The case whose completion this point is (when asked by case)."""
    cases_completed: int
    head: int
    """The run's last seq: `seq == head` means the memory at the end of the run."""

    def as_dict(self) -> dict:
        return {"seq": self.seq, "case_index": self.case_index, "cases_completed": self.cases_completed,
                "head": self.head, "at_head": self.seq == self.head}


def resolve_as_of(store: EventStore, run_id: str, as_of_case: int | None = None,
                  as_of_seq: int | None = None) -> AsOf:
    """The seq to fold up to: the run's head, a seq, or the `case.completed` of case index N."""
    require_spec(store, run_id)
    head = store.last_seq(run_id)
    if as_of_case is not None and as_of_seq is not None:
        raise AuditInputError("give --as-of-case or --as-of-seq, not both")
    case_index = None
    if as_of_case is not None:
        found = EventLog(store).seq_after_case(run_id, as_of_case)
        if found is None:
            n = completed_count(store, run_id, head)
            raise AuditInputError(f"run {run_id!r} has no completed case with index {as_of_case} "
                                  f"(completed cases: indexes 0..{n - 1})" if n else
                                  f"run {run_id!r} has no completed cases")
        seq, case_index = found, as_of_case
    elif as_of_seq is not None:
        if not 0 <= as_of_seq <= head:
            raise AuditInputError(f"--as-of-seq {as_of_seq} is outside run {run_id!r} (seqs 0..{head})")
        seq = as_of_seq
    else:
        seq = head
    return AsOf(seq, case_index, completed_count(store, run_id, seq), head)


def completed_count(store: EventStore, run_id: str, upto_seq: int) -> int:
    return EventLog(store).completed_cases(run_id, upto_seq=upto_seq)


def memory_at(store: EventStore, run_id: str, upto_seq: int | None = None) -> AuditMemory:
    """The run's memory state after folding every event up to `upto_seq` (None: the head)."""
    state = AuditMemory()
    log = EventLog(store)
    for e in log.events(run_id, upto_seq=upto_seq, types=MEMORY_TYPES, meta=False):  # meta is never state
        state.apply(e.seq, e.model())
    state.common.cases_received = log.count(run_id, types=["case.received"], upto_seq=upto_seq)
    if upto_seq is not None:
        state.common.last_seq = upto_seq
    return state


def utility_of(rule: Rule, state: EvoFold, policy: PolicyConfig) -> float | None:
    if not isinstance(policy, EvoMedAgentPolicy):
        return None
    return round(rule_utility(rule, state.feedback_count, policy), 6)


def case_indexes(store: EventStore, run_id: str) -> dict[str, int]:
    """case_id -> its index in the run's stream."""
    return EventLog(store).case_indexes(run_id)


def resolve_case(store: EventStore, run_id: str, ref: str) -> tuple[str, int]:
    """A case by id, or by its index in the stream (`17` or `#17`) when no case has that id."""
    require_spec(store, run_id)
    indexes = EventLog(store).case_indexes(run_id)
    if ref in indexes:
        return ref, indexes[ref]
    digits = ref.removeprefix("#")
    if digits.isdigit():
        by_index = {i: cid for cid, i in indexes.items()}
        if int(digits) in by_index:
            return by_index[int(digits)], int(digits)
    raise AuditInputError(f"run {run_id!r} received no case {ref!r} (give a case id, or an index 0..{len(indexes) - 1})")


def short(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
