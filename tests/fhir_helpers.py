"""What the MedAgentBench `grandrounds run --env medagentbench` tests share: the 8-task file, the CLI
call, and a fake OpenAI server playing the FHIR ReAct agent and reflector for task-1 templates."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from conftest import MAB_FUNCS as FUNCS, MAB_PATIENTS as PATIENTS, MAB_TASKS as TASKS
from fake_openai_server import FakeOpenAI
from grandrounds.cli import main

TYPES = ("1", "2", "3", "8")
"""The task types the local sandbox grades offline."""


def offline_tasks_file(directory: Path) -> Path:
    """Two tasks of each offline-gradable type (1, 2, 3, 8), in the official file's order: 8 tasks."""
    items = json.loads(TASKS.read_text())
    pick = [it for it in items if it["id"].split("_")[0][4:] in TYPES and int(it["id"].split("_")[1]) <= 2]
    path = directory / "tasks.json"
    path.write_text(json.dumps(pick))
    return path


def invoke_json(args: list[str], env: dict | None = None) -> tuple[int, dict]:
    r = CliRunner().invoke(main, [*args, "--json"], env=env or {})
    lines = r.stdout.strip().splitlines()
    assert lines, (r.output, r.exception, __import__("traceback").format_exception(*r.exc_info) if r.exc_info else None)
    return r.exit_code, json.loads(lines[-1])


def run_fhir(tasks: Path, db: Path, *extra: str, funcs: Path = FUNCS, patients: Path = PATIENTS,
             env: dict | None = None) -> tuple[int, dict]:
    return invoke_json(["run", str(tasks), "--env", "medagentbench", "--funcs", str(funcs),
                        "--patients", str(patients), "--db", str(db), *extra], env)


def patient_lookup_turn(messages: list[dict]) -> str:
    """The FHIR agent's next turn on a task-1 template: look the patient up by name and DOB, then
    FINISH with the id the lookup returned."""
    task = messages[1]["content"]
    m = re.search(r"name (\S+) (\S+) and DOB of (\d{4}-\d{2}-\d{2})", task)
    found = [re.search(r'"id": "(S\d+)"', x["content"]) for x in messages[2:] if x["role"] == "user"]
    found = [f.group(1) for f in found if f]
    if found:
        return f'<reasoning>found</reasoning><response>FINISH(["{found[0]}"])</response>'
    args = {"given": m.group(1), "family": m.group(2), "birthdate": m.group(3)}
    return ('<reasoning>look the patient up</reasoning><tool>'
            + json.dumps({"name": "get_patient", "arguments": args}) + "</tool>")


class FhirFake(FakeOpenAI):
    """Plays the FHIR ReAct agent for task-1 templates (look the patient up, FINISH with the id found)
    and the FHIR reflector (one rule for MRN lookups)."""

    def _text(self, kind, messages, action):
        if kind == "reflect":
            prompt = messages[1]["content"]
            assert "## FHIR task" in prompt and "What the grader checks" in prompt
            return json.dumps({"summary": "Looked the patient up by name and DOB.",
                               "guideline": "Search Patient by given, family and birthdate.",
                               "edits": [{"op": "add", "text": "MRN lookups: GET Patient with given, family and "
                                          "birthdate, FINISH with the id found.", "trigger": ["mrn", "name", "dob"],
                                          "priority": 1, "reason": "worked"}]})
        return patient_lookup_turn(messages)


def grade_now(case, trajectory, base, full_server=False, public_base=None):
    """refsol's verdict on a trajectory: the reference data read from `base` (as the environment does),
    POST URLs compared with `public_base` (the base the agent was shown; `base` when not given)."""
    import asyncio

    from grandrounds.handlers.environments.medagentbench import grade, reference
    from grandrounds.handlers.environments.medagentbench.client import FhirClient
    from grandrounds.handlers.environments.medagentbench.tasks import needs_full_server

    data = asyncio.run(reference(case, base, FhirClient())) if full_server or not needs_full_server(case) else None
    return grade(case, trajectory, public_base or base, data, full_server=full_server)


def ungated_policy(tmp_path, name: str = "evo-medagent") -> str:
    """A policy file: the preset without the k-subjects gate (memory_min_subjects = 1; the gate has its own
    tests in tests/test_privacy_freetext.py). Two tasks of one template are too few subjects for its words
    to pass, and the tests using this read what those tasks' memory holds."""
    path = tmp_path / f"{name}-ungated.toml"
    path.write_text(f'name = "{name}"\nmemory_min_subjects = 1\n')
    return str(path)
