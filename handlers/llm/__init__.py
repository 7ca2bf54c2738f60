"""The LLM gateway: every model call goes through `LLMGateway`, which records each attempt."""

from grandrounds.handlers.llm.errors import GatewayError, LLMUnavailable, ReplayDivergence, StructuredOutputError
from grandrounds.handlers.llm.gateway import LLMGateway, Reply, RetryPolicy

__all__ = ["GatewayError", "LLMGateway", "LLMUnavailable", "Reply", "ReplayDivergence", "RetryPolicy",
           "StructuredOutputError"]
