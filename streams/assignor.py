"""A co-partitioning assignor: partition p of every stage topic goes to the same worker.

FastStream gives each subscriber its own consumer, so a worker is five members of the
consumer group (one per stage topic). Kafka's stock assignors balance members, not
workers: retrieve-p could land on one worker and act-p on another, splitting a run across
two DuckDB files. Like Kafka Streams' own assignor, this one groups members by the worker
that owns them (sent as member user data) and deals partition numbers to workers:
worker k of n (sorted by id) owns every p with p % n == k, in every topic it subscribes to.
A partition whose owner has no member for some topic yet (a worker still starting its
consumers) stays unassigned in that topic until the member joins and triggers a rebalance.
"""

from __future__ import annotations

import collections
from typing import Iterable, Mapping

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

ASSIGNOR_NAME = "grandrounds-copartition"


def copartition_plan(workers_by_member: Mapping[str, str], subscriptions: Mapping[str, Iterable[str]],
                     partitions: Mapping[str, Iterable[int]]) -> dict[str, dict[str, list[int]]]:
    """member → topic → partitions. Pure, so it is tested without a broker."""
    workers = sorted(set(workers_by_member.values()))
    owner_index = {w: i for i, w in enumerate(workers)}
    plan: dict[str, dict[str, list[int]]] = collections.defaultdict(dict)
    taken: set[tuple[str, str]] = set()  # (worker, topic): one member per worker and topic
    for member in sorted(workers_by_member):
        worker = workers_by_member[member]
        k = owner_index[worker]
        for topic in sorted(set(subscriptions[member])):
            if (worker, topic) in taken:
                continue
            taken.add((worker, topic))
            plan[member][topic] = sorted(p for p in partitions.get(topic, ()) if p % len(workers) == k)
    return plan


def copartition_assignor(worker_id: str) -> type[AbstractPartitionAssignor]:
    """The assignor class for one worker process (its id travels in the member metadata)."""
    user_data = worker_id.encode("utf-8")

    class CopartitionAssignor(AbstractPartitionAssignor):
        name = ASSIGNOR_NAME
        version = 0

        @classmethod
        def assign(cls, cluster, members: Mapping[str, ConsumerProtocolMemberMetadata]):
            workers = {m: (meta.user_data or m.encode()).decode("utf-8", "replace") for m, meta in members.items()}
            subs = {m: list(meta.subscription) for m, meta in members.items()}
            topics = {t for s in subs.values() for t in s}
            parts = {t: sorted(cluster.partitions_for_topic(t) or ()) for t in topics}
            plan = copartition_plan(workers, subs, parts)
            return {m: ConsumerProtocolMemberAssignment(cls.version, sorted(plan.get(m, {}).items()), b"")
                    for m in members}

        @classmethod
        def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
            return ConsumerProtocolMemberMetadata(cls.version, list(topics), user_data)

        @classmethod
        def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
            pass

    return CopartitionAssignor
