"""The worker's counters and bounded latency histograms (`grandrounds worker --json`, benchmarks).

Apart from the worker so that what is measured can change without touching what is done.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

from grandrounds.handlers.stages import STAGES
from grandrounds.streams.latency import LatencyHistogram


@dataclass
class WorkerStats:
    processed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    skipped: int = 0
    own_deliveries: int = 0
    """Stage commands this worker took up as soon as it produced them (it owns their partition)."""
    echoes: int = 0
    """The consumer's copies of those commands, recognised and dropped."""
    early_copies: int = 0
    """Of the echoes: copies fetched before the produce ack came back (matched by step, not offset)."""
    dead_letters: int = 0
    failed: int = 0
    commit_failures: int = 0
    """Steps whose DuckDB commit or changelog batch was refused: their run was reloaded, restored
    and took them up again (nothing wrong with the messages, so no dead letter)."""
    runs_opened: int = 0
    cases_completed: int = 0
    restored_events: int = 0
    kicks: int = 0
    takeover_failures: int = 0
    signed_heads: int = 0
    """Heads of completed runs signed with the worker's key (none without a key)."""
    """Takeover attempts (restore + kick) that failed and were retried."""
    assignments: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    revocations: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    service_ms: dict[str, LatencyHistogram] = field(default_factory=lambda: defaultdict(LatencyHistogram))
    """Per stage: from the start of processing to the DuckDB commit (the stage, the changelog ack, and
    the grouped commit, which the run itself does not wait for)."""
    hop_ms: dict[str, LatencyHistogram] = field(default_factory=lambda: defaultdict(LatencyHistogram))
    """Per stage: from the command's produce timestamp to the start of its processing (for a command
    delivered on its produce ack: that round trip)."""
    step_log: list[tuple[str, int, str]] = field(default_factory=list)
    """(run, case index, stage) of every stage executed, in order (tests check for repeats)."""
    restore_seconds: deque = field(default_factory=lambda: deque(maxlen=64))
    """The last 64 takeovers' restore times (s)."""

    def latency(self) -> dict:
        """Per stage: service and hop time percentiles (ms), from bounded histograms (within 5 %)."""
        empty = LatencyHistogram()

        def pct(h: LatencyHistogram, q: float) -> float | None:
            v = h.quantile(q)
            return None if v is None else round(v, 2)

        return {stage: {"n": len(self.service_ms.get(stage, empty)),
                        "service_p50": pct(self.service_ms.get(stage, empty), 0.50),
                        "service_p99": pct(self.service_ms.get(stage, empty), 0.99),
                        "hop_p50": pct(self.hop_ms.get(stage, empty), 0.50),
                        "hop_p99": pct(self.hop_ms.get(stage, empty), 0.99)}
                for stage in STAGES}

    def as_dict(self) -> dict:
        return {
            "processed": dict(self.processed), "skipped_redeliveries": self.skipped,
            "own_deliveries": self.own_deliveries, "echoes": self.echoes, "early_copies": self.early_copies,
            "dead_letters": self.dead_letters, "failed": self.failed, "commit_failures": self.commit_failures,
            "runs_opened": self.runs_opened,
            "cases_completed": self.cases_completed, "restored_events": self.restored_events,
            "kicks": self.kicks, "takeover_failures": self.takeover_failures,
            "signed_heads": self.signed_heads, "assignments": dict(self.assignments), "revocations": dict(self.revocations),
            "restore_seconds": [round(x, 3) for x in self.restore_seconds],
            "latency_ms": self.latency(),
            "peak_rss_mb": _peak_rss_mb(),
        }


def _peak_rss_mb() -> float | None:
    # VmHWM, not ru_maxrss: a process spawned by a large parent inherits the parent's ru_maxrss.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
