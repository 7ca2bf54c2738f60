"""Starting and resuming a run: its spec is the first event, and a resume must match it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from handlers.backbones import make_backbone
from handlers.context import EventWriter, RunContext
from handlers.policies.config import PolicyConfig, policy_from_dict, policy_to_dict
from store.canonical import content_hash
from store.embeddings import EmbeddingCache
from store.event_types import RunStarted
from store.eventstore import EventStore
from store.projection import open_projection


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

    def started_event(self, embedder: str) -> RunStarted:
        return RunStarted(policy_name=self.policy.name, policy=policy_to_dict(self.policy),
                          backbone=self.backbone, model=self.model, seed=self.seed, lag=self.lag,
                          embedder=embedder, tools=dict(sorted(self.tools.items())), source=self.source)

    def default_run_id(self) -> str:
        return f"{self.policy.name}-{content_hash(self.model_dump(mode='json'))[:10]}"


class RunMismatch(ValueError):
    pass


def spec_of(started: RunStarted) -> RunSpec:
    return RunSpec(policy=policy_from_dict(started.policy), backbone=started.backbone, model=started.model,
                   seed=started.seed, lag=started.lag, tools=started.tools, source=started.source)


def read_spec(store: EventStore, run_id: str) -> RunSpec | None:
    first = store.read(run_id, upto_seq=0)
    if not first:
        return None
    started = first[0].decode()
    assert isinstance(started, RunStarted)
    return spec_of(started)


def open_run(store: EventStore, run_id: str, spec: RunSpec, cache: EmbeddingCache, **backbone_opts) -> tuple[RunContext, str]:
    """A context for the run, creating it (RunStarted at seq 0) or resuming it.

    Returns the context and how its projection was obtained (new/checkpoint/rebuild).
    """
    opened = open_projection(store, run_id, cache)
    proj = opened.projection
    writer = EventWriter(store, run_id, proj)
    started = spec.started_event(cache.embedder.name)
    if proj.seq < 0:
        writer.emit(started)
        writer.flush()
    else:
        recorded = store.read(run_id, upto_seq=0)[0].decode()
        if recorded != started:
            raise RunMismatch(
                f"run {run_id!r} already exists with a different configuration "
                f"(policy {recorded.policy_name}, backbone {recorded.backbone}, seed {recorded.seed}); "
                "choose another --run-id"
            )
    backbone = make_backbone(spec.backbone, spec.model, **backbone_opts)
    ctx = RunContext(run_id=run_id, policy=spec.policy, backbone=backbone, projection=proj, writer=writer,
                     seed=spec.seed, tools=dict(spec.tools))
    return ctx, opened.how
