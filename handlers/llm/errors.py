"""What can go wrong with a model call, as the stages need to tell it apart."""

from __future__ import annotations

from typing import Literal

from grandrounds.store.errors import GrandroundsError, Retryable
from grandrounds.store.event_types import AgentStep


class GatewayError(GrandroundsError, RuntimeError):
    pass


class LLMUnavailable(GatewayError):
    """The endpoint refused this request itself (bad request, e.g. an unsupported response format or a
    prompt over the context): retrying cannot fix it and it is a property of the request, so the case
    records it as failed. Infrastructure failures are `ModelOutage`, never this."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(f"{kind}: {message}")


class StructuredOutputError(GatewayError):
    """The model's output did not validate, even after the repair retry: the case fails."""


class ReplayDivergence(GatewayError):
    """A re-execution asked for an exchange the recorded run does not hold. Aborts the run:
    the re-execution is no longer the recorded one (DESIGN §3), so nothing after it is valid."""


class ModelOutage(GatewayError, Retryable):
    """The endpoint could not be reached or did not answer usably (refused, timed out, 5xx, 429,
    malformed, HTML or truncated body, rejected key) on every attempt of one call.

    Deliberately not an `LLMUnavailable`: the agent loops and policies catch that one and record the
    case as failed; this one passes through them and stops the run, with the interrupted case's events
    left unwritten, so the same command run later resumes at that case (DESIGN §5: an outage is never
    a terminal case result). `endpoint` is the base URL (never the key)."""

    def __init__(self, kind: str, message: str, endpoint: str, attempts: int, case_id: str = "", stage: str = ""):
        self.kind, self.endpoint, self.attempts, self.case_id, self.stage = kind, endpoint, attempts, case_id, stage
        self.detail = message
        where = f" on case {case_id} (stage {stage})" if case_id else ""
        super().__init__(f"model endpoint {endpoint} failed{where} after {attempts} attempt(s): {kind}: {message}")


class CaseFailure(GrandroundsError):
    """Raised by a backbone when a case cannot be completed (model unreachable after retries,
    output unusable to the last step). The stage records it as `case.failed` with `steps`,
    the trajectory so far, and memory is not written from the case."""

    def __init__(self, reason: str, steps: list[AgentStep] | None = None,
                 termination: Literal["invalid_action", "turn_limit", "error"] = "error"):
        self.reason = reason
        self.steps = list(steps or [])
        self.termination = termination
        """Why the episode ended without an answer: an invalid action (the official MedAgentBench
        protocol ends there), the turn limit, or an error (a model unreachable, a failed summary)."""
        super().__init__(reason)
