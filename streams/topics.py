"""Topic layout of the Kafka transport, broker URLs, and the run → partition mapping.

A topic per stage of the stage table (handlers/stages.py: retrieve, act, feedback, reflect, govern;
the first, the intake, carries each run's RunStart and cases), a changelog and a dead-letter topic.
Every message is keyed by run id and every keyed topic has the same partition count, so Kafka's
default partitioner puts a run in the same partition number everywhere: partition
p of the stage topics and partition p of the changelog hold the same runs. That is what lets
one worker own a run outright (DESIGN §4).
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiokafka.partitioner import murmur2

from grandrounds.handlers.stages import INTAKE_STAGE, STAGE_TABLE, STAGES, stage_def  # noqa: F401  (STAGES re-exported)

log = logging.getLogger("grandrounds.kafka")

DEFAULT_PREFIX = "grandrounds."
DEFAULT_GROUP = "grandrounds"
DEFAULT_PARTITIONS = 8


class BrokerUrlError(InvalidInput, ValueError):
    pass


def parse_broker_url(url: str) -> str:
    """`kafka://host:port[,host:port…]` → the bootstrap string aiokafka takes."""
    parts = urlsplit(url)
    if parts.scheme != "kafka" or not parts.netloc:
        raise BrokerUrlError(f"broker {url!r}: expected kafka://HOST:PORT (or 'memory' for the embedded runner)")
    hosts = [h.strip() for h in parts.netloc.split(",") if h.strip()]
    for h in hosts:
        host, sep, port = h.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise BrokerUrlError(f"broker {url!r}: {h!r} is not HOST:PORT")
    return ",".join(hosts)


@dataclass(frozen=True)
class Topics:
    """Topic names under one prefix (several deployments can share a cluster)."""

    prefix: str = DEFAULT_PREFIX

    def stage(self, stage: str) -> str:
        """The topic stage `stage` consumes (the stage table's `topic`, under the prefix)."""
        return f"{self.prefix}{stage_def(stage).topic}"

    @property
    def intake(self) -> str:
        """The topic a run enters by: its RunStart, then its cases (the stage table's intake stage)."""
        return self.stage(INTAKE_STAGE)

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(self.stage(s) for s in STAGES)

    @property
    def changelog(self) -> str:
        return f"{self.prefix}changelog"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}dead-letter"

    @property
    def keyed(self) -> tuple[str, ...]:
        """Topics that must share one partition count (co-partitioned by run id)."""
        return (*self.stages, self.changelog)

    def stage_of(self, topic: str) -> str:
        """The stage that consumes `topic` (one of `stages`)."""
        return _STAGE_OF_TOPIC[topic[len(self.prefix):]]


_STAGE_OF_TOPIC = {s.topic: s.name for s in STAGE_TABLE}


def partition_for(run_id: str, partitions: int) -> int:
    """The partition Kafka's default partitioner (Java's and aiokafka's) gives key `run_id`."""
    return (murmur2(run_id.encode("utf-8")) & 0x7FFFFFFF) % partitions


async def ensure_topics(bootstrap: str, topics: Topics, partitions: int = DEFAULT_PARTITIONS,
                        replication_factor: int | None = None) -> int:
    """Create missing topics; check that the keyed ones are co-partitioned. Returns their partition count.

    The changelog keeps everything (retention -1, no compaction: compaction would keep only the
    last batch of a run). Without `replication_factor`, min(3, brokers in the cluster).
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="grandrounds-admin")
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [*topics.keyed, topics.dead_letter]
        if replication_factor is None and any(name not in existing for name in wanted):
            cluster = await admin.describe_cluster()
            replication_factor = max(1, min(3, len(cluster.get("brokers", [])) or 1))
        new = []
        for name in wanted:
            if name in existing:
                continue
            configs = {"retention.ms": "-1", "cleanup.policy": "delete"} if name == topics.changelog else {}
            new.append(NewTopic(name, num_partitions=partitions, replication_factor=replication_factor,
                                topic_configs=configs))
        if new:
            try:
                resp = await admin.create_topics(new)
                for name, code, *rest in getattr(resp, "topic_errors", getattr(resp, "topics", [])):
                    if code not in (0, TopicAlreadyExistsError.errno):
                        raise RuntimeError(f"cannot create topic {name}: error {code} {rest}")
            except TopicAlreadyExistsError:
                pass  # another worker created them first
        counts = await _partition_counts(admin, list(topics.keyed))
    finally:
        await admin.close()
    if len(set(counts.values())) != 1:
        raise RuntimeError(
            "stage and changelog topics must have the same number of partitions (a run must map to the "
            f"same partition in each), found {counts}"
        )
    return next(iter(counts.values()))


async def _partition_counts(admin, names: list[str]) -> dict[str, int]:
    import asyncio

    for attempt in range(50):  # metadata of just-created topics can take a moment to appear
        described = await admin.describe_topics(names)
        counts = {}
        for t in described:
            name = t["topic"] if isinstance(t, dict) else t[1]
            parts = t["partitions"] if isinstance(t, dict) else t[3]
            err = t["error_code"] if isinstance(t, dict) else t[0]
            if err == 0 and parts:
                counts[name] = len(parts)
        if len(counts) == len(names):
            return counts
        await asyncio.sleep(0.1)
    raise RuntimeError(f"topics {names} did not become available")


async def partition_count(bootstrap: str, topic: str) -> int:
    """Partitions of an existing topic (0 if it does not exist)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="grandrounds-admin")
    await admin.start()
    try:
        if topic not in set(await admin.list_topics()):
            return 0
        return (await _partition_counts(admin, [topic]))[topic]
    finally:
        await admin.close()
