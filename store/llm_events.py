"""Events of the LLM gateway and of cases that could not be completed.

Every model call that got an answer (a reply, or a refusal of the request itself) is one
`llm.exchange` event, appended to the stage's batch before the response is parsed or used (DESIGN §3), so a replay can serve it by request
hash and an audit can show exactly what the model saw and said. Wall-clock latency and
where the response came from (live / recorded) go in the event's `meta`, never here: the
payload must be the same bytes when a recorded run is re-executed.

The API key and the endpoint URL are never part of a payload.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from grandrounds.store.event_types import AgentStep
from grandrounds.store.events import EventPayload, GrowingPayload, event


class LLMMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"]
    content: str


class TokenUsage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@event("llm.exchange")
class LLMExchange(EventPayload):
    stage: str
    """The pipeline stage that made the call (act, reflect, ...)."""
    purpose: str
    """What the call is for within the stage: `react-step-3`, `reflection`, `reflection-repair`."""
    request_hash: str
    """sha256 of the canonical JSON of (model, messages, params): the key a replay serves by."""
    model: str
    params: dict[str, Any] = Field(default_factory=dict)
    """Sampling parameters and the response format (JSON schema included) sent with the request."""
    messages: list[LLMMessage]
    attempt: int
    """Always 1 in events written since transport failures stopped being events: the event is the attempt
    that counted, and the failed transport attempts before it are in its `meta` (`failed_attempts`) and in
    the `llm_attempts` table, so an outage survived cannot change the fingerprint. Older logs hold one
    event per attempt (1, 2, ...; `outcome: error` for the failures); the record backend still serves them."""
    outcome: Literal["ok", "error"]
    response: str | None = None
    """The assistant message text, exactly as returned (before any parsing)."""
    finish_reason: str | None = None
    usage: TokenUsage | None = None
    error: str | None = None
    """For a refused request: `<kind>: <message>`, kind bad_request or other (older logs also hold
    rate_limit, server, timeout, connection, auth). Secrets are scrubbed before it is stored."""
    retryable: bool = False


@event("case.failed")
class CaseFailed(GrowingPayload):
    """A stage could not produce its result (model unreachable, output unusable to the end).

    stage `act`: no answer was recorded; the case counts as incorrect, and feedback, reflection
    and tool governance are skipped, so memory is not touched by the case. stage `reflect`: the
    answer was graded as usual, but no episode or rule is written from the case.
    """

    stage: str
    reason: str
    steps: list[AgentStep] = Field(default_factory=list)
    """The trajectory up to the failure (act), so the record stays complete."""
    termination: Literal["invalid_action", "turn_limit", "error"] | None = None
    """act: why the episode ended without an answer, typed (metrics count from it). Left out of the
    payload while None: logs written before it keep their bytes, and their metrics fall back to
    the reason's text."""

    omit_if_default: ClassVar[frozenset[str]] = frozenset({"termination"})
