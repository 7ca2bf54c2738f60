"""The consumer-group worker behind the FastStream app: exactly-once effect on at-least-once delivery.

Subscribers hand every message to `KafkaWorker.accept` and return at once, so each consumer
keeps polling (and its group membership) however long a stage takes — an LLM call can
outlast `max_poll_interval_ms`. The work itself runs in one task per run (`RunActor`), which
keeps the run strictly in order: a message is processed only when it is the run's next step
by the log; an earlier one is a redelivery and is skipped; a later one waits its turn.

Per stage message: the stage the case runs next by `handlers.pipeline.next_stage` runs (`run_stage`,
the one stage machine the embedded runner drives too); its batch of events goes to the changelog and the next stage's command to its
topic (both queued on one producer, in order). Where this worker owns the command's partition,
the run goes on with the next stage at once, without waiting for the broker: that step is
committed only once the command's offset is known (from the produce acknowledgement, or from
the consumer's copy if that comes first; the copy is then recognised and dropped). Elsewhere the
next stage comes from the other worker's consumer, after this step's DuckDB commit. The
`Committer` writes each step's events with its consumed (topic, partition, offset) in one
DuckDB transaction, after the changelog acknowledged the batch; the steps of all runs that are
ready share a transaction, on a thread of its own, and a run does not wait for it. Only then is
the message marked done (and, later, committed to Kafka). So the file is always a prefix of the
changelog, and a crash leaves one of: nothing of a step (the message comes back and the stage
runs again); its batch in the changelog only (the restore imports it, the message comes back and
is skipped); or the step committed (the message comes back and is skipped). What a crash can
lose — the next stage's command — is re-produced from the log when a worker takes the partition
("kick"). A batch or command the broker refuses fails the run's uncommitted steps: the run is
reloaded from the file, restored from the changelog and kicked; a later batch of the run that
landed past the refused one is skipped by every reader (`ChangelogImporter`) until the steps
come again in order.

On assignment of partition p: import from changelog partition p the events this DuckDB
file lacks, re-produce lost commands, and resume each topic at the offset stored in DuckDB
(where the file has none: the group's committed offset, else the beginning).

The package: worker.py (`KafkaWorker`, shared state, start and stop) put together from intake.py,
rebalance.py and group_offsets.py; commit.py (`Committer`: steps into DuckDB); actor.py
(`RunActor`); delivery.py (`Delivery` and its states); stats.py (`WorkerStats`).
"""

from grandrounds.handlers.stages import next_stage
from grandrounds.streams.kafka_worker.actor import RunActor, run_one_stage
from grandrounds.streams.kafka_worker.commit import Committer, Step
from grandrounds.streams.kafka_worker.delivery import START_KEY, STAGE_INDEX, Delivery, DeliveryState
from grandrounds.streams.kafka_worker.stats import WorkerStats
from grandrounds.streams.kafka_worker.worker import KafkaWorker

__all__ = ["Committer", "Delivery", "DeliveryState", "KafkaWorker", "RunActor", "START_KEY", "STAGE_INDEX", "Step",
           "WorkerStats", "next_stage", "run_one_stage"]
