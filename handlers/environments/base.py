"""What a case's environment gives the stages, and how a run records which environment it used.

MCQ cases need no environment beyond the simulated tools (`RunContext.tools`). Tool tasks do: a
MedAgentBench FHIR task is acted on through FHIR functions served by a server, and graded by
rules that read the agent's calls. The composition root (`grandrounds run --env ...`) builds the
environment, puts it on the run context (`RunContext.environment`) for act and feedback, and
tears it down after the run. Nothing of its machinery (ports, processes) enters event payloads:
the run's spec names it by content (`EnvironmentRecord.identity`, hashed into `RunSpec.source`),
and where its files were on this machine goes to the `run.started` event's meta, which is what
`grandrounds verify` reads to build it again.
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
import hashlib
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from grandrounds.store.canonical import content_hash
from grandrounds.store.event_types import AgentStep, AnswerGiven

META_KEY = "environment"
"""Key of the environment record in the `run.started` meta."""


class MissingEnvironment(InvalidInput, RuntimeError):
    """A case needs an environment the run does not have (a fhir case without `--env medagentbench`)."""


class FileRef(BaseModel):
    """A file an environment is built from: where it was, and what it held."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    """Absolute path when the run was made (a hint for re-execution; never part of the run's identity)."""
    sha256: str

    @classmethod
    def of(cls, path: str | Path) -> "FileRef":
        p = Path(path).resolve()
        return cls(path=str(p), sha256=hashlib.sha256(p.read_bytes()).hexdigest())

    def check(self) -> str | None:
        """None when the file is still there with the same content, else what is wrong."""
        p = Path(self.path)
        if not p.is_file():
            return f"{self.path} is missing"
        if hashlib.sha256(p.read_bytes()).hexdigest() != self.sha256:
            return f"{self.path} has changed since the run (sha256 differs)"
        return None


class EnvironmentRecord(BaseModel):
    """Which environment a run used: enough to build it again and to tell whether it is the same."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["medagentbench"] = "medagentbench"
    funcs: FileRef
    """funcs_v1.json: the FHIR function specs the agent is offered."""
    patients: FileRef | None = None
    """patients_from_snapshot.json served by the local sandbox; None with `fhir_base`."""
    fhir_base: str | None = None
    """A real FHIR server the run used instead of the sandbox."""
    protocol: Literal["official", "react"] = "react"
    """How a model agent acts: `official`, MedAgentBench's text protocol (GET/POST/FINISH replies, the
    official prompt, `max_rounds` replies; what `grandrounds run --env medagentbench` uses unless told
    otherwise), or `react`, the SkeMex-style tool-call loop. The field's default is `react` because
    runs recorded before it existed used that loop: their records read back unchanged."""
    max_rounds: int = Field(default=8, ge=1)
    """official: replies per task (8 in the official configuration)."""

    def identity(self) -> dict[str, Any]:
        """What makes two environments the same: contents and server, not paths."""
        out = {"environment": self.name, "funcs": self.funcs.sha256,
               "patients": self.patients.sha256 if self.patients else None, "fhir_base": self.fhir_base}
        if self.protocol == "official":  # react runs keep the identity (and run ids) they had before
            out.update(protocol="official", max_rounds=self.max_rounds)
        return out

    def source(self, cases: list[BaseModel]) -> str:
        """`RunSpec.source` of a run of these cases in this environment: a changed case selection,
        function file, snapshot or server is a different run (and a different default run id)."""
        return content_hash({"cases": content_hash([c.model_dump(mode="json") for c in cases]),
                             **self.identity()})

    def meta(self) -> dict[str, Any]:
        return {META_KEY: self.model_dump(mode="json")}


class Environment(Protocol):
    """What act and feedback use of a tool-task environment."""

    name: str
    record: EnvironmentRecord

    def tools_for(self, case: Any) -> Any:
        """Fresh tools for one case (their trajectory is that case's)."""
        ...

    def recorded_steps(self, steps: list[AgentStep], tools: Any) -> list[AgentStep]:
        """The agent's steps as they go into `answer.given`: tool steps replaced by the calls the
        environment executed, free of anything machine-specific (ports)."""
        ...

    async def grade(self, case: Any, answer: AnswerGiven) -> tuple[bool, str]:
        """(correct, gold description) from the recorded answer alone."""
        ...


def require_environment(ctx: Any, case: Any) -> Environment:
    env = getattr(ctx, "environment", None)
    if env is None:
        raise MissingEnvironment(
            f"case {case.case_id} is a {case.kind} task: it needs its environment (grandrounds run --env "
            "medagentbench --funcs FUNCS --patients PATIENTS)")
    return env
