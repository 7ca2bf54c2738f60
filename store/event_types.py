"""The domain events of a run. Each class is one event type; its fields are the payload.

Payloads hold only what state depends on and never the run id, so two runs given the same
inputs have the same fingerprint whatever they are called. Scores are rounded to 6 decimals
so tiny floating-point differences between CPUs do not change bytes.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from grandrounds.store.events import EventPayload, GrowingPayload, event, upcaster

Priority = Literal[0, 1, 2]
ToolLabel = Literal["Trusted", "Caution", "Avoid"]
ToolOutcomeKind = Literal["helpful", "harmful", "misuse", "neutral"]


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- run and case intake -------------------------------------------------------------


@event("run.started")
class RunStarted(GrowingPayload):
    policy_name: str
    policy: dict[str, Any]
    backbone: str
    model: str | None = None
    seed: int
    lag: int = 0
    embedder: str
    tools: dict[str, float] = Field(default_factory=dict)
    """Simulated tools offered by the environment, name -> reliability (sim backbone only)."""
    source: str | None = None
    """sha256 of the case file (or the parent run's case log) this run was started from."""
    agent: dict[str, int] = Field(default_factory=dict)
    """Agent-loop settings of model backbones that differ from the defaults (max_steps,
    summary_every): a replay of a model run re-executes with the same bounds."""
    memory_from: dict[str, Any] | None = None
    """Offline mode: the run whose memory this run starts from ({run_id, seq, chain}); the
    memory itself follows as `memory.seeded`."""
    cases: int | None = None
    """How many cases the run was started with (the case file's, or the submitter's count). When
    the last of them completes the run appends `run.completed`; `verify` reports a run with fewer
    completed cases, or without that event, as incomplete. None: written before runs declared it."""

    actions: dict[str, str] | None = None
    """Model backbones on MCQ cases: how agent turns are decoded, {"mode": "schema"|"text",
    "json_schema": the once-per-run probe's verdict (enforced, not-enforced, rejected, unreachable,
    or not-probed)}. Absent for runs that predate it (text protocol)."""

    code: dict[str, Any] | None = None
    """The versions of the code that shaped this run's events, {"policy": N, "stages": {stage: N}}
    (handlers/code_versions.py); `verify` compares them with its own build's. Absent for runs that
    predate it."""

    omit_if_default: ClassVar[frozenset[str]] = frozenset({"agent", "memory_from", "cases", "actions", "code"})


@event("memory.seeded")
class MemorySeeded(GrowingPayload):
    """Offline (train → test) mode: the memory events of a finished run, copied verbatim.

    Folding them gives this run the source run's memory at `source_seq` without reading the
    source file again, so the test run is self-contained for replay, verify and audit.
    """

    source_run: str
    source_seq: int
    source_chain: str
    source_policy: str
    source_backbone: str
    events: list[dict[str, Any]]
    """Each {seq, type, schema_version, payload} as stored in the source run."""
    source_cases: dict[str, str] = Field(default_factory=dict)
    """Case id -> content key (store/case_content.py) of every case the source memory saw, so the
    leakage guard also knows a test case that repeats a training case under another id."""

    omit_if_default: ClassVar[frozenset[str]] = frozenset({"source_cases"})


@event("case.received")
class CaseReceived(EventPayload):
    index: int
    """Position of the case in this run's stream, from 0."""
    case: dict[str, Any]
    """The whole validated case, gold answer included: feedback needs it, act never sees it."""


# --- retrieve ----------------------------------------------------------------------------


class RetrievedRule(_Part):
    rule_id: str
    text: str
    trigger: list[str]
    priority: Priority
    relevance: float
    utility: float
    score: float


class RetrievedEpisode(_Part):
    episode_id: str
    source_case_id: str
    summary: str
    guideline: str
    trigger: list[str]
    relevance: float


class ToolGuidance(_Part):
    tool: str
    label: ToolLabel


class MemoryItem(_Part):
    """A memory item of a policy other than Evo-MedAgent (skill, logical skill, lesson), as shown."""

    kind: str
    """What it is: `skill`, `logical-skill`, `experience`, ... (also the prefix of answer sources)."""
    item_id: str
    text: str
    """The text rendered to the agent."""
    trigger: list[str] = Field(default_factory=list)
    """Key terms the item applies to (the sim backbone matches them against the case)."""
    relevance: float = 0.0
    score: float = 0.0
    detail: dict[str, Any] = Field(default_factory=dict)
    """Policy-specific facts about the selection (branch, utility, strength, audience, ...)."""


@event("memory.retrieved")
class MemoryRetrieved(GrowingPayload):
    memory_seq: int
    """Seq of the last event folded into the memory this retrieval read (its version)."""
    rules: list[RetrievedRule] = Field(default_factory=list)
    episodes: list[RetrievedEpisode] = Field(default_factory=list)
    tool_guidance: list[ToolGuidance] = Field(default_factory=list)
    prefix: str = ""
    """The context prefix shown to the agent: protocol, governance, rules, episodes."""
    items: list[MemoryItem] = Field(default_factory=list)
    """Items of the SkeMex / SELSM / RetroSum policies (empty, and left out, for Evo-MedAgent)."""

    omit_if_default: ClassVar[frozenset[str]] = frozenset({"items"})


# --- act -----------------------------------------------------------------------------------


class AgentStep(_Part):
    kind: Literal["reasoning", "tool", "observation", "response", "summary", "memory"]
    """`summary`: a RetroSum retrospective summary written after that step (openai agent only;
    added later, so older logs simply never contain it). `memory`: the ids of memory items
    injected before that decision (per-step retrieval, SELSM)."""
    content: str


class ToolCall(_Part):
    tool: str
    label: ToolLabel
    output: str | None
    """The option letter the tool pointed to, or None when it returned nothing usable."""
    adopted: bool


@event("answer.given")
class AnswerGiven(EventPayload):
    answer: str
    source: str
    """What decided the answer: `rule:<id>`, `episode:<id>`, `tool:<name>` or `lexical`."""
    steps: list[AgentStep] = Field(default_factory=list)
    tool_calls: list[ToolCall] = Field(default_factory=list)


# --- feedback ------------------------------------------------------------------------------


class RuleOutcome(_Part):
    rule_id: str
    helpful: bool


class ToolOutcome(_Part):
    tool: str
    outcome: ToolOutcomeKind


@event("feedback.recorded", version=2)
class FeedbackRecorded(GrowingPayload):
    carries_memory: ClassVar[bool] = True
    answer: str
    gold: str
    correct: bool
    rule_outcomes: list[RuleOutcome] = Field(default_factory=list)
    tool_outcomes: list[ToolOutcome] = Field(default_factory=list)
    min_rounds: int | None = None
    """Tool tasks: the fewest agent turns that solve this task by its reference solution (MedAgentBench:
    refsol's branch for the task's data), OSR's T_min. Left out while None (MCQ, older logs)."""

    omit_if_default: ClassVar[frozenset[str]] = frozenset({"min_rounds"})


@upcaster("feedback.recorded", from_version=1)
def _feedback_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    # v1 recorded tool outcomes as two booleans; v2 names the outcome, adding `misuse`
    # and `neutral`, which v1 could not express (a v1 outcome with neither flag was neutral).
    out = dict(payload)
    converted = []
    for item in payload.get("tool_outcomes", []):
        kind = "helpful" if item.get("helpful") else "harmful" if item.get("harmful") else "neutral"
        converted.append({"tool": item["tool"], "outcome": kind})
    out["tool_outcomes"] = converted
    return out


# --- reflect -------------------------------------------------------------------------------


class RuleEditProposal(_Part):
    op: Literal["add", "edit", "reprioritise", "retire"]
    rule_id: str | None = None
    text: str | None = None
    trigger: list[str] | None = None
    priority: Priority | None = None
    reason: str = ""


@event("reflection.recorded")
class ReflectionRecorded(GrowingPayload):
    summary: str
    guideline: str
    edits: list[RuleEditProposal] = Field(default_factory=list)
    review: list[str] = Field(default_factory=list)
    """What the policy's review gate kept out of memory and why ("edit 0: only a finding of this
    case", "guideline: names an option by its letter"); the edits above are as proposed."""

    omit_if_default: ClassVar[frozenset[str]] = frozenset({"review"})


# --- govern --------------------------------------------------------------------------------


@event("case.completed")
class CaseCompleted(EventPayload):
    index: int
    correct: bool


@event("run.completed")
class RunCompleted(EventPayload):
    """The last case `run.started` declared has completed: the run's log is whole.

    Without it a log cut at a case boundary (its last cases' events deleted) looks like a
    finished shorter run; with it such a cut is visible without any key."""

    cases: int
    correct: int



# --- recorded inputs -----------------------------------------------------------------------


class RecordedVector(_Part):
    key: str
    """sha256(the cache's model name + newline + text): the embedding cache's key, so the text itself is not repeated."""
    q: str
    """The int8 quantized vector (store/vectors.py), base64 of its bytes."""


@event("embeddings.recorded")
class EmbeddingsRecorded(EventPayload):
    """The vectors a stage used that the run had not recorded yet: recorded inputs, like a model's replies.

    MiniLM's float vectors differ in their last bits between torch's CPU kernels, so a run's vectors are
    part of its record: `verify`, `replay` and every rebuild use these, and embed only a text the record
    lacks (DESIGN §3). Each key is recorded once a run; the fingerprint covers them."""

    model: str
    vectors: list[RecordedVector]
