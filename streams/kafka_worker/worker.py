"""`KafkaWorker`: the state the parts share, and start-up and shutdown.

The worker is put together from parts, each in its own module with one reason to change:
intake (messages in), rebalance (partitions assigned and revoked: restore, kick), group_offsets
(the consumer group's commits), commit (`Committer`: steps into DuckDB), actor (`RunActor`: a run's
steps in order), stats (counters). The parts share the state set up here.

Each run the worker takes up is a `Session` (streams/session.py) over the worker's one store and
embedder, opened as `grandrounds run`, `verify` and `replay` open theirs (the backbone built from
`backbone_opts`: an endpoint, `--agent`'s callable); the session's backbone is closed when the run's
state is dropped (`release`), and the worker waits for that when it closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any, Awaitable, Callable

from aiokafka import AIOKafkaConsumer

from grandrounds.handlers.backbones import BackboneUnavailable
from grandrounds.handlers.runs import RunSpec
from grandrounds.store.embeddings import EmbeddingCache
from grandrounds.store.eventstore import EventStore
from grandrounds.store.signing import SigningKey
from grandrounds.streams.kafka_worker.actor import RunActor
from grandrounds.streams.kafka_worker.commit import Committer
from grandrounds.streams.kafka_worker.group_offsets import GroupOffsets
from grandrounds.streams.kafka_worker.intake import Intake
from grandrounds.streams.kafka_worker.rebalance import Rebalance
from grandrounds.streams.kafka_worker.stats import WorkerStats
from grandrounds.streams.offsets import PartitionOffsets
from grandrounds.streams.session import Session
from grandrounds.streams.topics import Topics

log = logging.getLogger("grandrounds.kafka")

Publish = Callable[..., Awaitable[Any]]


class KafkaWorker(Intake, Rebalance, GroupOffsets):
    def __init__(self, store: EventStore, cache: EmbeddingCache, *, bootstrap: str, topics: Topics,
                 group_id: str, worker_id: str, partitions: int, checkpoint_every: int = 250,
                 max_buffered: int = 10_000, revoke_timeout: float = 30.0, keep_step_log: bool = False,
                 backbone_opts: dict | None = None, signing_key: SigningKey | None = None,
                 agent_name: str | None = None):
        self.store = store
        self.cache = cache
        self.bootstrap = bootstrap
        self.topics = topics
        self.group_id = group_id
        self.worker_id = worker_id
        self.partitions = partitions
        self.checkpoint_every = checkpoint_every
        self.max_buffered = max_buffered
        self.revoke_timeout = revoke_timeout
        self.keep_step_log = keep_step_log
        self.backbone_opts = backbone_opts or {}
        """What each run's backbone is built with (`make_backbone` options): an endpoint, `agent` (the
        `--agent` callable)."""
        self.agent_name = agent_name
        """The name `--agent`'s replies are recorded under (`--model`, default the module:callable): the only
        `agent` runs this worker takes (their spec's model). None: no agent, no `agent` runs."""
        self._releasing: set[asyncio.Task] = set()
        self.signing_key = signing_key
        """Signs the head of every run this worker completes (GRANDROUNDS_SIGNING_KEY or --key-file)."""
        self.stats = WorkerStats()
        self.actors: dict[str, RunActor] = {}
        self.offsets: dict[tuple[str, int], PartitionOffsets] = {}
        self.paused: set[tuple[str, int]] = set()
        self.owners: dict[int, set[str]] = defaultdict(set)
        self.takeovers: dict[int, asyncio.Task] = {}
        self.consumers: dict[str, AIOKafkaConsumer] = {}
        self.publish_stage: Publish | None = None  # (stage, StageCommand) -> None
        self.publish_changelog: Publish | None = None  # (list[StoredEvent]) -> None
        self.publish_dead_letter: Publish | None = None  # (DeadLetter, key) -> None
        self.accepting = True
        self._restore_lock = asyncio.Lock()
        self._restorer: AIOKafkaConsumer | None = None
        self._group_committer: asyncio.Task | None = None
        self.committer = Committer(self)

    # --- shutdown ------------------------------------------------------------------------

    async def quiesce(self) -> None:
        """Stop taking messages, let steps in flight finish, commit, checkpoint every run."""
        self.accepting = False
        await self._quiesce_runs(set(self.actors))
        await self.committer.settle()
        await self.committer.store_positions()
        try:
            await self.commit_all()
        except Exception:  # noqa: BLE001
            log.warning("final offset commit failed", exc_info=True)
        if self._group_committer is not None:
            self._group_committer.cancel()
            self._group_committer = None
        for actor in list(self.actors.values()):
            actor.close()
        self.actors.clear()
        self.cache.flush()

    async def close(self) -> None:
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)
        self.committer.close()
        for task in self.takeovers.values():
            task.cancel()
        if self._restorer is not None:
            await self._restorer.stop()
            self._restorer = None

    # --- the runs' sessions ---------------------------------------------------------------

    def check_backbone(self, run_id: str, spec: RunSpec) -> None:
        """Refuse (bad input) a run of the `agent` backbone this worker cannot answer for: no `--agent`, or
        one recorded under another name (its replies would be another agent's under this one's name)."""
        if spec.backbone != "agent":
            return
        if self.agent_name is None:
            raise BackboneUnavailable(f"run {run_id!r} is answered by agent {spec.model!r}: this worker has no agent "
                                      f"(start it with --agent module:callable --model {spec.model})")
        if spec.model != self.agent_name:
            raise BackboneUnavailable(f"run {run_id!r} is answered by agent {spec.model!r}; this worker's agent is "
                                      f"{self.agent_name!r} (--model names the agent a run records)")

    def release(self, session: Session) -> None:
        """A run's state is dropped: close its session's loop-bound clients (the backbone's), without making
        the caller wait; `close` waits for what is still closing."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the worker's loop (a test): nothing runs concurrently, close it now
            asyncio.run(self._aclose(session))
            return
        task = loop.create_task(self._aclose(session))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    @staticmethod
    async def _aclose(session: Session) -> None:
        try:
            await session.aclose()
        except Exception:  # noqa: BLE001 - a client that does not close cleanly must not stop the worker
            log.warning("run %s: closing its backbone failed", session.run_id, exc_info=True)

    def summary(self) -> dict:
        return dict(self.stats.as_dict(), embedding_cache_misses=self.cache.misses,
                    commits={"transactions": self.committer.transactions, "stage_batches": self.committer.batches})
