"""What can go wrong with a model call, as the stages need to tell it apart."""

from __future__ import annotations


class GatewayError(RuntimeError):
    pass


class LLMUnavailable(GatewayError):
    """Retries exhausted, or an error retrying cannot fix (auth, bad request): the case fails."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(f"{kind}: {message}")


class StructuredOutputError(GatewayError):
    """The model's output did not validate, even after the repair retry: the case fails."""


class ReplayDivergence(GatewayError):
    """A re-execution asked for an exchange the recorded run does not hold. Aborts the run:
    the re-execution is no longer the recorded one (DESIGN §3), so nothing after it is valid."""
