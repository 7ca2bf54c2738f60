"""How a request reaches a model: the `openai` client (live) or a recorded run (record).

A transport sends one attempt and either returns the reply or raises `TransportFailure`
saying whether a retry can help. Retrying, recording and parsing are the gateway's job.
"""

from __future__ import annotations

from grandrounds.store.errors import Retryable
import json
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grandrounds.store.llm_events import TokenUsage


@dataclass(frozen=True)
class RawReply:
    text: str
    finish_reason: str | None
    usage: TokenUsage | None


class TransportFailure(Retryable):
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


MAX_BODY_BYTES = 4 * 1024 * 1024
"""A reply body larger than this is refused as malformed: `max_tokens` bounds an honest reply to a few
KB, so megabytes mean a misbehaving server, and nothing that size should reach the log."""


class _Choice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    class _Message(BaseModel):
        model_config = ConfigDict(extra="ignore")
        content: str | None = None

    message: _Message
    finish_reason: str | None = None


class _Completion(BaseModel):
    """The part of a chat completion body we use, validated: anything else is a malformed reply."""

    model_config = ConfigDict(extra="ignore")

    class _Usage(BaseModel):
        model_config = ConfigDict(extra="ignore")
        prompt_tokens: int | None = 0
        completion_tokens: int | None = 0
        total_tokens: int | None = 0

    choices: list[_Choice] = Field(min_length=1)
    usage: _Usage | None = None


class OpenAITransport:
    """Any OpenAI-compatible endpoint via `openai.AsyncOpenAI`, built once per backbone.

    The client's own retries are off (`max_retries=0`): the gateway retries, so that every attempt is
    seen. The body is read raw and validated here rather than by the client, so that every way a
    server can misbehave (non-JSON, HTML, a JSON error object with status 200, no choices, a truncated
    or oversized body) becomes one retryable `TransportFailure` of kind `malformed` instead of an
    exception the caller would take for bad input or a crash.
    """

    served = "live"

    def __init__(self, base_url: str | None, api_key: str, timeout: float = 300.0):
        import openai

        self._openai = openai
        self._key = api_key
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0)
        self.endpoint = str(self.client.base_url).rstrip("/")

    async def send(self, call: Call) -> RawReply:
        o = self._openai
        try:
            raw = await self.client.chat.completions.with_raw_response.create(
                model=call.model, messages=call.messages, **call.params)
        except o.APITimeoutError as exc:
            raise TransportFailure("timeout", self._msg(exc), True) from None
        except o.APIConnectionError as exc:
            raise TransportFailure("connection", self._msg(exc), True) from None
        except o.APIStatusError as exc:
            raise self._status_failure(exc) from None
        except o.OpenAIError as exc:  # anything else the client raises while reading the reply
            raise TransportFailure("malformed", self._msg(exc), True) from None
        try:
            body = await raw.http_response.aread()  # already read for a plain request; re-raises a cut-off body
        except Exception as exc:  # noqa: BLE001 - the HTTP library's own read errors (httpx)
            raise TransportFailure("connection", self._msg(exc) or type(exc).__name__, True) from None
        return self._parse(body, raw.http_response.headers.get("content-type", ""))

    def _parse(self, body: bytes, content_type: str) -> RawReply:
        if len(body) > MAX_BODY_BYTES:
            raise TransportFailure("malformed", f"reply body of {len(body)} bytes exceeds {MAX_BODY_BYTES}", True)
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            head = body[:200].decode("utf-8", "replace")
            raise TransportFailure("malformed", f"reply is not JSON ({content_type or 'no content-type'}): "
                                                f"{self._scrub(head)!r}", True) from None
        try:
            resp = _Completion.model_validate(data)
        except ValidationError as exc:
            summary = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors()[:3])
            head = json.dumps(data)[:200] if isinstance(data, (dict, list)) else repr(data)[:200]
            raise TransportFailure("malformed", f"reply is not a chat completion ({summary}): {self._scrub(head)}",
                                   True) from None
        choice = resp.choices[0]
        u = resp.usage
        usage = TokenUsage(prompt_tokens=u.prompt_tokens or 0, completion_tokens=u.completion_tokens or 0,
                           total_tokens=u.total_tokens or 0) if u is not None else None
        return RawReply(choice.message.content or "", choice.finish_reason, usage)

    def _scrub(self, text: str) -> str:
        return _scrub(text, self._key)

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
