"""The MedAgentBench environment of a `grandrounds run`: FHIR tools per case, and refsol grading
from the recorded answer.

Built from an `EnvironmentRecord` (funcs_v1.json, and the patient snapshot for the local sandbox or
a real server's `fhir_base`). `open_environment` starts the sandbox for the run and stops it after.

The sandbox listens on a free port, so its real base changes from run to run. The agent is shown the
official base (`http://localhost:8080/fhir/`, as `grandrounds medagentbench` does) and every call it
makes is recorded in `answer.given` at that public base; feedback rebuilds the trajectory from those
steps (and, for the official text protocol, the conversation: `reasoning` steps are the raw replies,
`observation` steps the harness's answers) and grades it against the public base, reading the
reference data from the server. So the events of a run are the same bytes whatever port the sandbox
got, and grading reads only what the log holds (a case resumed after act grades the same).
"""

from __future__ import annotations

from grandrounds.store.errors import Bug
import json
from contextlib import contextmanager
from typing import Iterator

from grandrounds.handlers.cases import FhirCase
from grandrounds.handlers.environments.base import EnvironmentRecord
from grandrounds.handlers.environments.medagentbench.client import FhirClient, FhirTransportError
from grandrounds.handlers.environments.medagentbench.grading import Grade, grade, reference
from grandrounds.handlers.environments.medagentbench.tasks import FhirFunction, NeedsFullServer, load_functions, needs_full_server
from grandrounds.handlers.environments.medagentbench.tools import FhirTools
from grandrounds.handlers.environments.medagentbench.trajectory import FhirCall, FhirTrajectory, Message
from grandrounds.store.event_types import AgentStep, AnswerGiven

OFFICIAL_BASE = "http://localhost:8080/fhir/"
"""The official harness's default api_base: the base the agent sees when the sandbox serves."""
OFFICIAL_SOURCE = "llm:official"
"""`answer.given.source` of an episode in the official text protocol (its steps hold the conversation)."""


class TrajectoryMismatch(Bug, RuntimeError):
    """The agent's tool steps and the calls the tools executed do not pair up (a bug in an agent loop)."""


class MedAgentBenchEnvironment:
    name = "medagentbench"

    def __init__(self, record: EnvironmentRecord, functions: list[FhirFunction], base: str):
        self.record = record
        self.functions = functions
        self.base = base if base.endswith("/") else base + "/"
        """Where requests go: the sandbox's address on this machine, or the real server."""
        self.full_server = record.fhir_base is not None
        self.public_base = (record.fhir_base or OFFICIAL_BASE).rstrip("/") + "/"
        """What the agent sees and the log records."""
        self.client = FhirClient()
        with open(record.funcs.path, encoding="utf-8") as f:
            self.functions_json = json.dumps(json.load(f))  # as the official harness shows them
        self._patients: dict[str, dict] | None = None

    def patient(self, mrn: str) -> dict | None:
        """The snapshot's Patient resource of an MRN (None without a snapshot): the structured identifiers
        memory written from that patient's case is de-identified of (`handlers/deidentify.py`)."""
        if self._patients is None:
            if self.record.patients is None:
                return None
            self._patients = {}
            with open(self.record.patients.path, encoding="utf-8") as f:
                resources = json.load(f)  # the snapshot: a JSON list of Patient resources
            for p in resources:
                self._patients[p.get("id")] = p
                for ident in p.get("identifier", []) or []:
                    self._patients.setdefault(ident.get("value"), p)
        return self._patients.get(mrn)

    # -- act ----------------------------------------------------------------------------------

    def tools_for(self, case: FhirCase) -> FhirTools:
        return FhirTools(self.functions, self.base, public_base=self.public_base, client=self.client,
                         protocol=self.record.protocol, functions_json=self.functions_json,
                         max_rounds=self.record.max_rounds)

    def public(self, text: str) -> str:
        return text.replace(self.base, self.public_base) if self.base != self.public_base else text

    def call_record(self, call: FhirCall, name: str | None) -> str:
        """One executed call as a `tool` step: canonical JSON at the public base."""
        return call.record(name, self.public(call.url))

    def recorded_steps(self, steps: list[AgentStep], tools: FhirTools) -> list[AgentStep]:
        """Pair the i-th `tool` step with the i-th executed call (each tool turn executes exactly one)."""
        calls = tools.trajectory.calls
        n_tool = sum(s.kind == "tool" for s in steps)
        if n_tool != len(calls):
            raise TrajectoryMismatch(f"{n_tool} tool steps but {len(calls)} FHIR calls executed")
        out, i = [], 0
        for s in steps:
            if s.kind == "tool":
                try:
                    name = json.loads(s.content).get("name")
                except (json.JSONDecodeError, AttributeError):
                    name = None
                out.append(AgentStep(kind="tool", content=self.call_record(calls[i], name)))
                i += 1
            else:
                out.append(AgentStep(kind=s.kind, content=self.public(s.content)))
        return out

    # -- feedback -----------------------------------------------------------------------------

    def trajectory_of(self, answer: AnswerGiven) -> FhirTrajectory:
        """The trajectory as grading needs it, rebuilt from the recorded steps (at the public base)."""
        t = FhirTrajectory(result=answer.answer)
        official = answer.source == OFFICIAL_SOURCE
        if official:
            t.history = []
        for s in answer.steps:
            if official and s.kind == "reasoning":
                t.history.append(Message("agent", s.content))
            elif official and s.kind == "observation":
                t.history.append(Message("user", s.content))
            if s.kind != "tool":
                continue
            c = json.loads(s.content)
            t.calls.append(FhirCall(c["method"], c["url"], c.get("payload"), bool(c["accepted"])))
        return t

    async def grade_trajectory(self, case: FhirCase, trajectory: FhirTrajectory) -> Grade:
        if needs_full_server(case) and not self.full_server:
            raise NeedsFullServer(f"{case.case_id}: task type {case.task_type} is graded against the real "
                                  "MedAgentBench server only (--fhir-base)")
        try:
            data = await reference(case, self.base, self.client)
        except (FhirTransportError, ValueError) as exc:  # refsol would raise on it: incorrect
            return Grade(False, f"reference data unavailable: {self.public(str(exc))}")
        return grade(case, trajectory, self.public_base, data, full_server=self.full_server)

    async def verdict(self, case: FhirCase, answer: AnswerGiven) -> tuple[bool, str, int]:
        """(correct, gold, T_min) by the official refsol rules; gold names the reference and the
        verdict's reason; T_min is the reference solution's rounds for this task's data."""
        g = await self.grade_trajectory(case, self.trajectory_of(answer))
        return g.correct, f"{case.answer}: {self.public(g.reason)}", g.min_rounds

    async def grade(self, case: FhirCase, answer: AnswerGiven) -> tuple[bool, str]:
        correct, gold, _ = await self.verdict(case, answer)
        return correct, gold


def build(record: EnvironmentRecord, base: str) -> MedAgentBenchEnvironment:
    return MedAgentBenchEnvironment(record, load_functions(record.funcs.path), base)


@contextmanager
def open_environment(record: EnvironmentRecord) -> Iterator[MedAgentBenchEnvironment]:
    """The environment for one run: the sandbox is started here and stopped on the way out."""
    if record.fhir_base is not None:
        yield build(record, record.fhir_base)
        return
    if record.patients is None:
        raise ValueError("the local sandbox needs the patient snapshot (--patients)")
    from grandrounds.sandbox.fhir_server import FhirSandbox

    with FhirSandbox.from_file(record.patients.path) as sandbox:
        yield build(record, sandbox.base)
