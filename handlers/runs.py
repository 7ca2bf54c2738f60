"""Starting and resuming a run: its spec is the first event, and a resume must match it."""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from grandrounds.handlers.backbones import make_backbone
from grandrounds.handlers.code_versions import code_versions
from grandrounds.handlers.context import EventWriter, RunContext
from grandrounds.handlers.policies.config import PolicyConfig, policy_from_dict, policy_record
from grandrounds.store.canonical import content_hash
from grandrounds.store.embeddings import EmbeddingCache
from grandrounds.store.event_types import MemorySeeded, RunStarted
from grandrounds.store.eventstore import EventStore
from grandrounds.store.projection import open_projection


class RunSpec(BaseModel):
    """Everything that determines a run's events besides its cases."""

    model_config = ConfigDict(frozen=True)

    policy: PolicyConfig
    backbone: str = "sim"
    model: str | None = None
    seed: int = 0
    lag: int = 0
    tools: dict[str, float] = Field(default_factory=dict)
    source: str | None = None
    agent: dict[str, int] = Field(default_factory=dict)
    """Agent-loop settings that differ from the defaults: max_steps, summary_every (model backbones)."""
    memory_from: dict[str, Any] | None = None
    """Offline mode: {run_id, seq, chain} of the run whose memory this run starts from."""
    actions: dict[str, str] | None = None
    """Model backbones: {"mode": "schema"|"text", "json_schema": probe verdict}; None = text protocol."""
    code: dict[str, Any] | None = None
    """The code versions the run records (handlers/code_versions.py). Left None, this build's are
    filled in; a spec read back from a log carries what the log recorded, `{}` for a log that
    predates versions, so a re-execution writes the very `run.started` the log holds."""

    def model_post_init(self, __context: Any) -> None:
        if self.code is None:  # a new run: this build's versions (frozen model: set once, here)
            object.__setattr__(self, "code", code_versions(self.policy))

    def started_event(self, embedder: str, cases: int | None = None) -> RunStarted:
        """`cases`: how many cases the run is started with (declared, so a cut log shows)."""
        return RunStarted(policy_name=self.policy.name, policy=policy_record(self.policy),
                          backbone=self.backbone, model=self.model, seed=self.seed, lag=self.lag,
                          embedder=embedder, tools=dict(sorted(self.tools.items())), source=self.source,
                          agent=dict(sorted(self.agent.items())), memory_from=self.memory_from, cases=cases,
                          actions=dict(sorted(self.actions.items())) if self.actions else None,
                          code=self.code or None)

    def default_run_id(self) -> str:
        # Fields added later count only when set, so existing runs keep their ids.
        # `code` never counts: the same command names the same run whatever the build.
        data = self.model_dump(mode="json", exclude={"code"} | {k for k in ("agent", "memory_from", "actions")
                                                                  if not getattr(self, k)})
        return f"{self.policy.name}-{content_hash(data)[:10]}"


class DeclaredCount(InvalidInput, ValueError):
    """A run opened with a case count that is not a positive integer (bad input: nothing is written)."""


def is_declared_count(cases: Any) -> bool:
    """Whether `cases` is a count a run may declare: a positive whole number (a bool is not one)."""
    return isinstance(cases, int) and not isinstance(cases, bool) and cases >= 1


def check_declared_count(cases: Any, run_id: str) -> None:
    """A run declares a positive whole number of cases, or none (an open-ended stream): else `DeclaredCount`."""
    if cases is not None and not is_declared_count(cases):
        raise DeclaredCount(f"run {run_id!r}: a run declares a positive whole number of cases, not {cases!r} "
                            "(or none, for an open-ended stream)")


class RunMismatch(InvalidInput, ValueError):
    pass


def spec_of(started: RunStarted) -> RunSpec:
    return RunSpec(policy=policy_from_dict(started.policy, recorded=True), backbone=started.backbone, model=started.model,
                   seed=started.seed, lag=started.lag, tools=started.tools, source=started.source,
                   agent=started.agent, memory_from=started.memory_from, actions=started.actions,
                   code=started.code if started.code is not None else {})


def spec_difference(recorded: RunStarted, asked: RunStarted) -> str:
    """The fields in which two run configurations differ, as `field recorded X, asked Y` (policy
    settings by name, `policy.top_k` ...), so a user sees which option to change."""
    a, b = recorded.model_dump(mode="json"), asked.model_dump(mode="json")
    diffs = []

    def walk(x, y, path: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), f"{path}.{k}" if path else k)
        elif x != y:
            diffs.append(f"{path} recorded {json.dumps(x)}, asked {json.dumps(y)}")

    walk(a, b, "")
    shown = [d for d in diffs if not d.startswith("policy_name ")] or diffs
    return "; ".join(shown[:4]) + (f" (and {len(shown) - 4} more)" if len(shown) > 4 else "") or "same fields"


def read_spec(store: EventStore, run_id: str) -> RunSpec | None:
    first = store.read(run_id, upto_seq=0)
    if not first:
        return None
    started = first[0].decode()
    assert isinstance(started, RunStarted)
    return spec_of(started)


def declared_cases(store: EventStore, run_id: str) -> int | None:
    """The case count a run's `run.started` declared (None: none declared, or no such run)."""
    first = store.read(run_id, upto_seq=0)
    if not first or not isinstance(started := first[0].decode(), RunStarted):
        return None
    return started.cases


def check_same_run(recorded: RunStarted, started: RunStarted, run_id: str, *, same_embedder: bool = True) -> None:
    """Raise RunMismatch unless `started` asks for the run `recorded` began (the case count only
    where both declare one). `same_embedder=False`: a client that does not load the embedder
    (run --broker) leaves that field to the worker."""
    if started.cases is not None and recorded.cases is not None and recorded.cases != started.cases:
        raise RunMismatch(f"run {run_id!r} was started with {recorded.cases} cases, not {started.cases}; "
                          "resume it with the same cases, or choose another --run-id")
    update = {"cases": recorded.cases} if same_embedder else {"cases": recorded.cases, "embedder": recorded.embedder}
    if recorded != started.model_copy(update=update):
        raise RunMismatch(
            f"run {run_id!r} already exists with a different configuration: {spec_difference(recorded, started)}; "
            "choose another --run-id"
        )


def open_run(store: EventStore, run_id: str, spec: RunSpec, cache: EmbeddingCache,
             seeded: MemorySeeded | None = None, started_meta: dict[str, Any] | None = None,
             cases: int | None = None, **backbone_opts) -> tuple[RunContext, str]:
    """A context for the run, creating it (RunStarted at seq 0) or resuming it.

    `seeded` (offline mode, with `spec.memory_from`): the source run's memory, written as
    the run's second event when the run is created. `started_meta`: meta of the RunStarted
    event when the run is created (never state: where a tool-task environment's files were,
    for re-execution). `cases`: the case count a new run declares in `run.started` (a resumed run
    keeps the count it declared; a different one is a mismatch). Returns the context and how its
    projection was obtained (new/checkpoint/rebuild).
    """
    if (seeded is None) != (spec.memory_from is None) and not store.has_run(run_id):
        raise ValueError("memory_from and the seeded memory go together")
    check_declared_count(cases, run_id)
    opened = open_projection(store, run_id, cache)
    proj = opened.projection
    started = spec.started_event(cache.embedder.name, cases)
    if proj.seq >= 0:
        check_same_run(store.read(run_id, upto_seq=0)[0].decode(), started, run_id)
    # The backbone is built before anything is written: one that cannot be built (no API key, say)
    # is bad input, and a refused command writes nothing.
    actions = {"actions": spec.actions["mode"]} if spec.actions else {}
    backbone = make_backbone(spec.backbone, spec.model, **{**backbone_opts, **spec.agent, **actions})
    writer = EventWriter(store, run_id, proj)
    if proj.seq < 0:
        writer.emit(started, meta=started_meta)
        if seeded is not None:
            writer.emit(seeded)
        writer.flush()
    ctx = RunContext(run_id=run_id, policy=spec.policy, backbone=backbone, projection=proj, writer=writer,
                     seed=spec.seed, tools=dict(spec.tools), lag=spec.lag)
    return ctx, opened.how
