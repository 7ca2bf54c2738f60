"""`KafkaWorker`: the state the parts share, and start-up and shutdown.

The worker is put together from parts, each in its own module with one reason to change:
intake (messages in), rebalance (partitions assigned and revoked: restore, kick), group_offsets
(the consumer group's commits), commit (`Committer`: steps into DuckDB), actor (`RunActor`: a run's
steps in order), stats (counters). The parts share the state set up here.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any, Awaitable, Callable

from aiokafka import AIOKafkaConsumer

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
from grandrounds.streams.topics import Topics

log = logging.getLogger("grandrounds.kafka")

Publish = Callable[..., Awaitable[Any]]


class KafkaWorker(Intake, Rebalance, GroupOffsets):
    def __init__(self, store: EventStore, cache: EmbeddingCache, *, bootstrap: str, topics: Topics,
                 group_id: str, worker_id: str, partitions: int, checkpoint_every: int = 250,
                 max_buffered: int = 10_000, revoke_timeout: float = 30.0, keep_step_log: bool = False,
                 backbone_opts: dict | None = None, signing_key: SigningKey | None = None):
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
        self.committer.close()
        for task in self.takeovers.values():
            task.cancel()
        if self._restorer is not None:
            await self._restorer.stop()
            self._restorer = None

    def summary(self) -> dict:
        return dict(self.stats.as_dict(), embedding_cache_misses=self.cache.misses,
                    commits={"transactions": self.committer.transactions, "stage_batches": self.committer.batches})
