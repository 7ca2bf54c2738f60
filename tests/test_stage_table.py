"""One stage table (handlers/stages.py `STAGE_TABLE`): every reader of the stages sees exactly it.

The pipeline (which handler a stage runs, what a case's progress is read back from), the lag pipeline
(which stages are pinned, which run ahead), the Kafka worker (step order, the intake, the stage that closes
a case), its topics and the FastStream app (one subscriber and publisher per stage, the intake's message
model) and the CLI's help all derive their view from the table. Adding a stage to the table that one of
them does not know fails here: their views are compared with the table, and no reader spells a stage's
name out in its code.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import typing
from pathlib import Path

import pytest

from conftest import run_in
from grandrounds.handlers import pipeline, stages
from grandrounds.handlers.code_versions import code_versions
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.stages import INTAKE_STAGE, STAGE_TABLE, STAGE_VERSIONS, STAGES, CaseProgress, next_stage
from grandrounds.store.llm_events import CaseFailed

ROOT = Path(__file__).resolve().parents[1]

READERS = ["handlers/pipeline.py", "streams/lag.py", "streams/topics.py", "streams/kafka_app.py",
           "streams/producer.py", "streams/embedded.py", "streams/session.py", "grandrounds/cli_kafka.py",
           *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "streams" / "kafka_worker").glob("*.py"))]
"""The modules that drive or route stages: none may name a stage in its code (they read the table)."""


def test_the_table_is_well_formed():
    assert len(STAGES) == len(set(STAGES)) == len(STAGE_TABLE) >= 1
    assert typing.get_args(stages.Stage) == STAGES  # the Literal for type checkers names the same stages
    assert [s.name for s in STAGE_TABLE if s.intake] == [STAGES[0]] == [INTAKE_STAGE]  # a case enters by the first
    assert [s.name for s in STAGE_TABLE if s.closes_case] == [STAGES[-1]]  # and is closed by the last
    fields = {f.name for f in dataclasses.fields(CaseProgress)}
    assert all(s.field in fields for s in STAGE_TABLE) and len({s.field for s in STAGE_TABLE}) == len(STAGE_TABLE)
    assert len({s.output for s in STAGE_TABLE}) == len(STAGE_TABLE)
    assert len({s.topic for s in STAGE_TABLE}) == len(STAGE_TABLE)
    assert all(s.doc for s in STAGE_TABLE)
    # pinned stages are a prefix (a case acts on pinned memory, then learns live); the ahead pass runs a prefix too
    pinned = [s.pinned for s in STAGE_TABLE]
    ahead = [s.ahead for s in STAGE_TABLE]
    assert pinned == sorted(pinned, reverse=True) and ahead == sorted(ahead, reverse=True)
    assert all(a for p, a in zip(pinned, ahead) if p)


def test_a_case_that_goes_through_every_stage_visits_the_table_in_order():
    p, seen = CaseProgress(), []
    while (stage := next_stage(p)) is not None:
        seen.append(stage)
        row = stages.stage_def(stage)
        setattr(p, row.field, object())
    assert tuple(seen) == STAGES


def test_the_pipeline_runs_each_stage_through_its_table_handler(example_cases, monkeypatch):
    """run_stage (the embedded runner's and the Kafka worker's one stage) dispatches through the table."""
    from grandrounds.handlers.runs import RunSpec
    from grandrounds.store.eventstore import EventStore

    ran = []

    def traced(row):
        async def run(ctx, case, index, progress):
            ran.append((case.case_id, row.name))
            await row.run(ctx, case, index, progress)

        return dataclasses.replace(row, run=run)

    monkeypatch.setattr(stages, "STAGE_BY_NAME", {s.name: traced(s) for s in STAGE_TABLE})
    store = EventStore(":memory:")
    run_in(store, example_cases[:2], RunSpec(policy=EvoMedAgentPolicy(memory_min_subjects=1)))
    assert ran == [(c.case_id, s) for c in example_cases[:2] for s in STAGES]


def test_a_case_s_progress_is_read_back_by_each_stage_s_output():
    want = {s.output.event_type: s.field for s in STAGE_TABLE}
    assert pipeline.PROGRESS_FIELDS == {**want, CaseFailed.event_type: "failed"}


def test_the_lag_pipeline_pins_and_runs_ahead_what_the_table_says():
    from grandrounds.streams import lag

    assert lag.PINNED_STAGES == tuple(s.name for s in STAGE_TABLE if s.pinned)
    assert lag.AHEAD_STAGES == tuple(s.name for s in STAGE_TABLE if s.ahead)
    assert set(lag.PINNED_STAGES) <= set(lag.AHEAD_STAGES) < set(STAGES)  # the case closes in order, live


def test_the_worker_orders_steps_and_counts_stages_by_the_table():
    from grandrounds.streams.kafka_worker import STAGE_INDEX, WorkerStats

    assert STAGE_INDEX == {s.name: i for i, s in enumerate(STAGE_TABLE)}
    assert tuple(WorkerStats().as_dict()["latency_ms"]) == STAGES


def test_topics_are_one_per_stage_and_map_back():
    from grandrounds.streams.topics import Topics

    topics = Topics("p.")
    assert topics.stages == tuple(f"p.{s.topic}" for s in STAGE_TABLE)
    assert topics.keyed == (*topics.stages, topics.changelog)
    assert topics.intake == topics.stage(INTAKE_STAGE)
    assert [topics.stage_of(topics.stage(s)) for s in STAGES] == list(STAGES)
    with pytest.raises(ValueError, match="unknown stage"):
        topics.stage("triage")


def test_the_kafka_app_subscribes_and_publishes_every_stage_with_its_message_model():
    from grandrounds.streams.kafka_app import asyncapi_document, build_broker, command_schema
    from grandrounds.streams.messages import RetrieveCommand, StageCommand
    from grandrounds.streams.topics import Topics

    _, subscribers, publishers = build_broker("localhost:9092", Topics("p."))
    assert tuple(subscribers) == STAGES
    assert tuple(publishers)[:len(STAGES)] == STAGES and set(publishers) - set(STAGES) == {"changelog", "dead_letter"}
    assert {s.name: command_schema(s) for s in STAGE_TABLE} == {
        s.name: RetrieveCommand if s.intake else StageCommand for s in STAGE_TABLE}
    channels = json.loads(asyncapi_document())["channels"]
    for s in STAGE_TABLE:
        sub = channels[f"grandrounds.{s.topic}:{s.name}"]
        assert sub["description"] == s.doc
        assert f"grandrounds.{s.topic}:publish" in channels


def test_code_versions_are_the_table_s():
    assert tuple(STAGE_VERSIONS) == STAGES
    assert code_versions(EvoMedAgentPolicy())["stages"] == {s.name: s.version for s in STAGE_TABLE}


def test_the_cli_help_names_the_table_s_stages():
    from click.testing import CliRunner

    from grandrounds.cli import main

    names = "|".join(STAGES)
    for command in ("worker", "submit", "collect"):
        out = CliRunner().invoke(main, [command, "--help"], terminal_width=400)
        assert out.exit_code == 0, out.output
        assert f"PREFIX + {names}" in " ".join(out.output.split()), (command, out.output)


@pytest.mark.parametrize("path", READERS)
def test_no_reader_names_a_stage_in_its_code(path):
    """A stage named as a string constant in a reader (`if stage == "govern"`, `topics.stage("retrieve")`) is
    a second table: it must ask the table (`closes_case`, `INTAKE_STAGE`, a row's `pinned`...) instead."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    named = sorted({(n.lineno, n.value) for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in STAGES})
    assert named == [], f"{path} names stages {named}: read them from handlers/stages.py STAGE_TABLE"


def test_a_stage_the_table_does_not_know_is_refused():
    with pytest.raises(ValueError, match="unknown stage 'triage'"):
        stages.stage_def("triage")
    with pytest.raises(ValueError, match="unknown stage"):
        asyncio.run(pipeline.run_stage(None, None, 0, CaseProgress(), "triage"))
