"""Structured outputs from pydantic models, with a fallback for servers without JSON schema.

`schema` mode sends `response_format={"type": "json_schema", ...}` built from the model.
A server that rejects it (400) gets the same request in `prompt` mode: the schema goes into
the prompt and the reply is parsed from text. Either way, a reply that does not validate
gets one repair retry that shows the model its output and the validation error.
"""

from __future__ import annotations

import json
import re
from typing import Literal, TypeVar

from pydantic import BaseModel, ValidationError

from grandrounds.handlers.llm.errors import LLMUnavailable, StructuredOutputError
from grandrounds.handlers.llm.gateway import LLMGateway
from grandrounds.handlers.llm.recorder import Recorder

M = TypeVar("M", bound=BaseModel)
Mode = Literal["auto", "schema", "prompt"]

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def response_format(model: type[BaseModel]) -> dict:
    return {"type": "json_schema",
            "json_schema": {"name": model.__name__, "schema": model.model_json_schema(), "strict": False}}


def schema_instruction(model: type[BaseModel]) -> str:
    schema = json.dumps(model.model_json_schema(), sort_keys=True, separators=(",", ":"))
    return ("Reply with a single JSON object and nothing else (no prose, no code fence). "
            f"It must validate against this JSON schema: {schema}")


def parse_json_reply(text: str, model: type[M]) -> M:
    """The model instance in `text`: bare JSON, fenced JSON, or the outermost {...} in prose."""
    candidates = [text.strip()]
    candidates += [m.strip() for m in _FENCE.findall(text)]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start:end + 1])
    error: Exception | None = None
    for c in candidates:
        try:
            return model.model_validate_json(c)
        except ValidationError as exc:
            error = exc
    raise StructuredOutputError(_short(error) if error else "no JSON object found")


def _short(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        errs = exc.errors()[:3]
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in errs)
    return str(exc)[:300]


async def structured(gateway: LLMGateway, messages: list[dict[str, str]], model: type[M], recorder: Recorder,
                     purpose: str, mode: Mode = "auto") -> M:
    params: dict | None = None
    if mode in ("auto", "schema"):
        params = {"response_format": response_format(model)}
        try:
            reply = await gateway.complete(messages, recorder, purpose, params=params)
            sent = messages
        except LLMUnavailable as exc:
            if mode == "schema" or exc.kind != "bad_request":
                raise
            mode, params = "prompt", None  # the server does not take json_schema: say it in the prompt
    if mode == "prompt":
        sent = _with_instruction(messages, schema_instruction(model))
        reply = await gateway.complete(sent, recorder, f"{purpose}-prompt-json")
    try:
        return parse_json_reply(reply.text, model)
    except StructuredOutputError as exc:
        first_error = str(exc)
    repair = sent + [
        {"role": "assistant", "content": reply.text},
        {"role": "user", "content": f"That reply did not validate ({first_error}). "
                                    + schema_instruction(model)},
    ]
    reply = await gateway.complete(repair, recorder, f"{purpose}-repair", params=params)
    try:
        return parse_json_reply(reply.text, model)
    except StructuredOutputError as exc:
        raise StructuredOutputError(f"{model.__name__} output invalid after one repair: {exc}") from None


def _with_instruction(messages: list[dict[str, str]], instruction: str) -> list[dict[str, str]]:
    out = [dict(m) for m in messages]
    out[-1]["content"] = f"{out[-1]['content']}\n\n{instruction}"
    return out
