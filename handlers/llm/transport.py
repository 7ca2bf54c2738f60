"""How a request reaches a model: the `openai` client (live) or a recorded run (record).

A transport sends one attempt and either returns the reply or raises `TransportFailure`
saying whether a retry can help. Retrying, recording and parsing are the gateway's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from grandrounds.store.llm_events import TokenUsage


@dataclass(frozen=True)
class RawReply:
    text: str
    finish_reason: str | None
    usage: TokenUsage | None


class TransportFailure(Exception):
    def __init__(self, kind: str, message: str, retryable: bool, retry_after: float | None = None):
        self.kind, self.message, self.retryable, self.retry_after = kind, message, retryable, retry_after
        super().__init__(f"{kind}: {message}")


@dataclass(frozen=True)
class Call:
    """One attempt as the transport sees it; `case_id`/`stage` only name a divergence."""

    request_hash: str
    model: str
    messages: list[dict[str, str]]
    params: dict[str, Any]
    attempt: int
    case_id: str
    stage: str
    purpose: str


class Transport(Protocol):
    served: str
    """`live` or `record`: goes into each exchange event's meta."""

    async def send(self, call: Call) -> RawReply: ...

    async def aclose(self) -> None: ...


def _scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


class OpenAITransport:
    """Any OpenAI-compatible endpoint via `openai.AsyncOpenAI`, built once per backbone.

    The client's own retries are off (`max_retries=0`): the gateway retries, so that every
    attempt is an event.
    """

    served = "live"

    def __init__(self, base_url: str | None, api_key: str, timeout: float = 300.0):
        import openai

        self._openai = openai
        self._key = api_key
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0)

    async def send(self, call: Call) -> RawReply:
        o = self._openai
        try:
            resp = await self.client.chat.completions.create(model=call.model, messages=call.messages,
                                                             **call.params)
        except o.APITimeoutError as exc:
            raise TransportFailure("timeout", self._msg(exc), True) from None
        except o.APIConnectionError as exc:
            raise TransportFailure("connection", self._msg(exc), True) from None
        except o.APIStatusError as exc:
            raise self._status_failure(exc) from None
        choice = resp.choices[0] if resp.choices else None
        text = (choice.message.content or "") if choice is not None else ""
        u = resp.usage
        usage = TokenUsage(prompt_tokens=u.prompt_tokens or 0, completion_tokens=u.completion_tokens or 0,
                           total_tokens=u.total_tokens or 0) if u is not None else None
        return RawReply(text, choice.finish_reason if choice is not None else None, usage)

    def _msg(self, exc: Exception) -> str:
        return _scrub(str(exc), self._key)[:2000]

    def _status_failure(self, exc) -> TransportFailure:
        code = exc.status_code
        retry_after = None
        try:
            ra = exc.response.headers.get("retry-after")
            retry_after = float(ra) if ra is not None else None
        except (AttributeError, ValueError):
            pass
        if code == 429:
            return TransportFailure("rate_limit", self._msg(exc), True, retry_after)
        if code >= 500 or code in (408, 409):
            return TransportFailure("server", self._msg(exc), True, retry_after)
        if code in (401, 403):
            return TransportFailure("auth", self._msg(exc), False)
        if code in (400, 404, 422):
            return TransportFailure("bad_request", self._msg(exc), False)
        return TransportFailure("other", self._msg(exc), False)

    async def aclose(self) -> None:
        await self.client.close()
