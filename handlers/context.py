"""What a stage needs to run: the run's policy, backbone, live projection and event writer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grandrounds.handlers.backbones.base import Backbone
from grandrounds.handlers.policies.config import PolicyConfig
from grandrounds.store.eventstore import ConsumedOffset, EventStore
from grandrounds.store.events import EventPayload, NewEvent, StoredEvent
from grandrounds.store.projection import MemoryProjection


class EventWriter:
    """Buffers a stage's events, applying each to the live projection as it is emitted.

    Seqs are assigned at emit time (they are gapless and known in advance), so an event can
    name an earlier one of the same batch as its cause. `flush` appends the buffer as one
    transaction; a conflict there means the projection is ahead of the log and the caller
    must reopen it.
    """

    def __init__(self, store: EventStore, run_id: str, projection: MemoryProjection):
        self.store = store
        self.run_id = run_id
        self.projection = projection
        self.committed_seq = projection.seq
        self.pending: list[NewEvent] = []
        self.deidentifier = None
        """`handlers.deidentify.Deidentifier`: memory events lose their case's identifiers before
        the projection (and so any later retrieval) sees them. Set by `RunContext`."""

    @property
    def next_seq(self) -> int:
        return self.committed_seq + len(self.pending) + 1

    def emit(self, payload: EventPayload, case_id: str | None = None, causation_seq: int | None = None,
             meta: dict[str, Any] | None = None) -> int:
        seq = self.next_seq
        dumped = None
        if self.deidentifier is not None:
            self.deidentifier.observe(payload, case_id)
            if payload.carries_memory:
                payload, dumped = self.deidentifier.scrub_dumped(payload, case_id)
        self.pending.append(NewEvent(payload, case_id, causation_seq, meta or {}, dumped))
        self.projection.apply(seq, payload)
        return seq

    def flush(self, consumed: ConsumedOffset | None = None) -> list[StoredEvent]:
        if not self.pending and consumed is None:
            return []
        stored = self.store.append(self.run_id, self.pending, self.committed_seq, consumed=consumed)
        self.pending = []
        if stored:
            self.committed_seq = stored[-1].seq
            self.projection.last_chain = stored[-1].chain
        return stored


@dataclass
class RunContext:
    run_id: str
    policy: PolicyConfig
    backbone: Backbone
    projection: MemoryProjection
    writer: EventWriter
    seed: int
    tools: dict[str, float] = field(default_factory=dict)
    lag: int = 0
    """The run's `lag` (run.started): case i reads memory as of the end of case i-1-lag (streams/lag.py)."""
    environment: Any = None
    """The tool-task environment act and feedback use (`handlers.environments.base.Environment`), built
    by the composition root for the run; None for MCQ runs, whose simulated tools are `tools`."""
    mechanism: Any = field(init=False, repr=False)
    """The policy's stage-facing implementation (`handlers.policies.base.MemoryPolicy`)."""

    def __post_init__(self) -> None:
        from grandrounds.handlers.policies.registry import make_mechanism

        self.mechanism = make_mechanism(self.policy)
        # The policy config's privacy fields (recorded in run.started, so a re-execution de-identifies alike).
        patterns = getattr(self.policy, "deidentify_patterns", 1)
        if self.writer.deidentifier is None:
            from grandrounds.handlers.deidentify import Deidentifier

            self.writer.deidentifier = Deidentifier(self.writer.store, self.run_id, self._patient_directory,
                                                    min_subjects=getattr(self.policy, "memory_min_subjects", 1),
                                                    patterns=patterns)
        else:  # a writer that brought its own (the lag pass's scratch writer: it scrubs retrieval queries only)
            self.writer.deidentifier.configure(getattr(self.policy, "memory_min_subjects", 1), patterns)

    def retrieval_text(self, text: str, case_id: str | None) -> str:
        """`text` (a case's question, an agent state) de-identified as the case's memory events are, so a
        retrieval query meets stored items like with like: memory holds `[MRN]` where the live question
        still names the patient, and the raw identifier would only pull the two apart (SELSM's state
        threshold of 0.9 missed every short FHIR template). Unchanged when the text names no one."""
        if self.writer.deidentifier is None:
            return text
        # `memory`, not `text`: the query also loses the words the k-subjects rule withholds from the case's
        # memory (memory_min_subjects), as every stored item lost its own. A word only this case and one
        # other hold was withheld from the other's memory; left in the query it matches nothing there and
        # only pulls the query's vector away from memory's (RetroSum's top-1 experience at cosine >= 0.5,
        # sim, examples/cases.jsonl: 20/78 correct with the raw query, 41/78 with this one).
        return self.writer.deidentifier.scrubber(case_id).memory(text)

    def _patient_directory(self):
        """The environment's patient lookup (MRN -> FHIR Patient), read when first needed: the
        composition root sets `environment` after the context is built."""
        return getattr(self.environment, "patient", None)
