"""The FHIR ReAct loop and the FHIR `sim` agent, end to end against the local sandbox, graded by refsol rules."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from grandrounds.handlers.agent.fhir_react import parse_fhir_turn, run_fhir_agent, sim_fhir_agent
from grandrounds.handlers.agent.react import AgentConfig
from grandrounds.handlers.backbones.base import CaseFailure
from grandrounds.sandbox.fhir_server import FhirSandbox
from grandrounds.handlers.environments.medagentbench import (
    OFFLINE_TASK_TYPES, FhirTools, NeedsFullServer, load_functions, load_tasks)
from grandrounds.handlers.llm.recorder import Recorder

from fhir_helpers import grade_now
from conftest import MAB_FUNCS as FUNCS, MAB_PATIENTS as PATIENTS, MAB_TASKS as TASKS, needs_medagentbench

pytestmark = needs_medagentbench


@pytest.fixture(scope="module")
def env():
    with FhirSandbox.from_file(PATIENTS) as sandbox:
        yield sandbox, load_functions(FUNCS), {c.case_id: c for c in load_tasks(TASKS)}


class ScriptedGateway:
    """Stands in for `LLMGateway`: replays fixed model outputs and keeps the prompts it was sent."""

    model = "scripted"

    def __init__(self, replies: list[str]):
        self.replies = list(replies)
        self.prompts: list[list[dict]] = []

    async def complete(self, messages, recorder, purpose, params=None):
        self.prompts.append(messages)

        class R:
            text = self.replies.pop(0)
        return R()


def recorder() -> Recorder:
    return Recorder("c", "act", lambda payload, meta: 0)


def test_parse_fhir_turn():
    assert parse_fhir_turn("<reasoning>r</reasoning><response>FINISH([\"S1\"])</response>", ["get_patient"]).answer == '["S1"]'
    t = parse_fhir_turn('<reasoning>r</reasoning><tool>{"name": "get_patient", "arguments": {"identifier": "S1"}}</tool>',
                        ["get_patient"])
    assert t.kind == "tool" and t.arguments == {"identifier": "S1"}
    assert "unknown function" in parse_fhir_turn('<tool>{"name": "x"}</tool>', ["get_patient"]).error
    assert "disabled" in parse_fhir_turn('<tool>{"name": "get_patient"}</tool>', ["get_patient"], False).error
    assert "missing action" in parse_fhir_turn("FINISH([1])", ["get_patient"]).error


def test_react_loop_solves_task1_through_the_sandbox(env):
    sandbox, functions, cases = env
    case = cases["mab-task1_1"]
    gw = ScriptedGateway([
        "<reasoning>look up</reasoning><tool>{bad json</tool>",
        '<reasoning>look up</reasoning><tool>{"name": "get_patient", "arguments": '
        '{"given": "Peter", "family": "Stafford", "birthdate": "1932-12-29"}}</tool>',
        '<reasoning>found</reasoning><response>FINISH(["S6534835"])</response>'])
    tools = FhirTools(functions, sandbox.base)
    answer = asyncio.run(run_fhir_agent(gw, case.view(), tools, recorder()))
    assert answer.answer == '["S6534835"]'
    assert [s.kind for s in answer.steps].count("tool") == 1
    assert any("Parse error" in m["content"] for m in gw.prompts[1])  # corrective observation
    first = "\n".join(m["content"] for m in gw.prompts[0])
    assert "get_patient" in gw.prompts[0][0]["content"] and case.instruction in first
    assert "S6534835" not in first  # the gold `sol` is never shown
    assert grade_now(case, tools.trajectory, sandbox.base).correct


def test_react_loop_task3_post_and_failure_without_finish(env):
    sandbox, functions, cases = env
    case = cases["mab-task3_1"]
    payload = {"resourceType": "Observation",
               "category": [{"coding": [{"system": "http://hl7.org/fhir/observation-category",
                                         "code": "vital-signs", "display": "Vital Signs"}]}],
               "code": {"text": "BP"}, "effectiveDateTime": "2023-11-13T10:15:00+00:00", "status": "final",
               "valueString": "118/77 mmHg", "subject": {"reference": "Patient/S2380121"}}
    gw = ScriptedGateway([f'<reasoning>post</reasoning><tool>{{"name": "post_observation", "arguments": {json.dumps(payload)}}}</tool>',
                          "<reasoning>done</reasoning><response>FINISH([])</response>"])
    tools = FhirTools(functions, sandbox.base)
    asyncio.run(run_fhir_agent(gw, case.view(), tools, recorder()))
    assert grade_now(case, tools.trajectory, sandbox.base).correct
    assert tools.trajectory.calls[-1].payload == payload and sandbox.posts == []  # accepted, never sent

    gw = ScriptedGateway(['<reasoning>x</reasoning><tool>{"name": "get_patient", "arguments": {}}</tool>'] * 3)
    with pytest.raises(CaseFailure, match="no FINISH"):
        asyncio.run(run_fhir_agent(gw, case.view(), FhirTools(functions, sandbox.base), recorder(),
                                   AgentConfig(max_steps=3)))
    assert "FINISH" in gw.prompts[-1][-1]["content"]  # the final-step notice speaks the FHIR protocol


def test_the_react_loop_writes_retrosums_summaries_and_grading_is_unchanged(env):
    """RetroSum in the FHIR react loop (issue 44): a summary after step 2 of the task's lookups, one
    more at the end; the summariser is told the task and its context, never the gold."""
    from grandrounds.handlers.agent.retrosum import Retrospection
    sandbox, functions, cases = env
    case = cases["mab-task1_1"]
    look = ('<reasoning>look up</reasoning><tool>{"name": "get_patient", "arguments": '
            '{"given": "Peter", "family": "Stafford", "birthdate": "1932-12-29"}}</tool>')
    gw = ScriptedGateway(["<reasoning>r</reasoning><tool>{bad json</tool>", look, "SUMMARY AFTER 2",
                          '<reasoning>found</reasoning><response>FINISH(["S6534835"])</response>', "END SUMMARY"])
    tools = FhirTools(functions, sandbox.base)
    answer = asyncio.run(run_fhir_agent(gw, case.view(), tools, recorder(), retrospection=Retrospection(2),
                                        lessons=["Keep the identifier the lookup returns."]))
    kinds = [s.kind for s in answer.steps]
    assert kinds[-2:] == ["response", "summary"] and kinds.count("summary") == 2
    assert [s.content for s in answer.steps if s.kind == "summary"] == ["SUMMARY AFTER 2", "END SUMMARY"]
    summariser = gw.prompts[2][1]["content"]
    assert case.instruction in summariser and "## Full history (steps 1-2)" in summariser
    assert "Keep the identifier the lookup returns." in summariser and "S6534835" not in summariser.split("### Step")[0]
    assert "SUMMARY AFTER 2" in gw.prompts[3][-1]["content"]  # the actor sees it after the raw turns
    assert "## Previous summary (written after step 2)" in gw.prompts[4][1]["content"]
    assert grade_now(case, tools.trajectory, sandbox.base).correct
    # without retrospection (every policy but RetroSum) the FHIR loop writes none, as before issue 44
    gw = ScriptedGateway([look, '<reasoning>found</reasoning><response>FINISH(["S6534835"])</response>'])
    plain = asyncio.run(run_fhir_agent(gw, case.view(), FhirTools(functions, sandbox.base), recorder(),
                                       AgentConfig(summary_every=1)))
    assert "summary" not in [s.kind for s in plain.steps] and len(gw.prompts) == 2


def test_sim_agent_runs_every_offline_task_and_grades_it(env):
    sandbox, functions, cases = env
    results = Counter()
    for case in cases.values():
        tools = FhirTools(functions, sandbox.base)
        asyncio.run(sim_fhir_agent(case.view(), tools))
        if case.task_type in OFFLINE_TASK_TYPES:
            results[case.task_type] += grade_now(case, tools.trajectory, sandbox.base).correct
        else:
            with pytest.raises(NeedsFullServer):
                grade_now(case, tools.trajectory, sandbox.base)
    assert results == {1: 30, 2: 30, 3: 30, 8: 30}


def test_cli_grades_offline_types_and_all_types_with_fhir_base(env):
    from click.testing import CliRunner

    from grandrounds.cli import main

    sandbox = env[0]
    common = [str(TASKS), "--funcs", str(FUNCS), "--json"]
    r = CliRunner().invoke(main, ["medagentbench", *common, "--patients", str(PATIENTS)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["tasks"] == 300 and out["graded"] == 120 and out["correct"] == 120
    assert out["per_task_type"]["4"]["needs_full_server"] == 30
    # --fhir-base: every type is graded against that server (here the sandbox stands in for it; its
    # empty Observation bundles make the lab tasks degenerate, e.g. task 10 always needs an order)
    r = CliRunner().invoke(main, ["medagentbench", *common, "--fhir-base", sandbox.base, "--task-type", "4",
                                  "--task-type", "10"])
    out = json.loads(r.stdout)
    assert r.exit_code == 0 and out["graded"] == 60
    assert out["per_task_type"]["4"]["correct"] == 30 and out["per_task_type"]["10"]["correct"] == 0
    r = CliRunner().invoke(main, ["medagentbench", *common])
    assert r.exit_code == 2 and "--fhir-base" in json.loads(r.stdout)["error"]
