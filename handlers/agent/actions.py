"""Structured agent actions: each turn decoded against a JSON schema of that turn's legal moves.

Where the server enforces `response_format: json_schema` (llama.cpp, vLLM and OpenAI do; probed
once per run by `probe_json_schema` and recorded in `run.started`), an MCQ turn is one JSON object:
`reasoning` first (the model thinks before it commits), then exactly one `action`: a tool call
(`tool` an enum of the tools allowed at this step) or a response (`answer` an enum of the option
letters). On the last step the schema offers only the response. The model cannot copy a
placeholder or invent a tag variant: an answer it gives is one of the letters, by construction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

ActionsMode = Literal["text", "schema"]

REASONING_CHARS = 600
"""Bound on the reasoning string: a weak model can repeat inside a JSON string until max_tokens."""


def mcq_action_schema(letters: list[str], tools: list[str]) -> dict[str, Any]:
    respond = {"type": "object", "properties": {"answer": {"type": "string", "enum": list(letters)}},
               "required": ["answer"], "additionalProperties": False}
    if tools:
        call = {"type": "object", "properties": {"tool": {"type": "string", "enum": list(tools)},
                                                 "arguments": {"type": "object"}},
                "required": ["tool"], "additionalProperties": False}
        action: dict[str, Any] = {"anyOf": [respond, call]}
    else:
        action = respond
    return {"type": "object",
            "properties": {"reasoning": {"type": "string", "maxLength": REASONING_CHARS}, "action": action},
            "required": ["reasoning", "action"], "additionalProperties": False}


def response_format(schema: dict[str, Any], name: str = "AgentTurn") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@dataclass(frozen=True)
class SchemaTurn:
    kind: Literal["tool", "response", "invalid"]
    reasoning: str
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    answer: str | None = None
    error: str | None = None


def parse_schema_turn(text: str, letters: list[str], tools: list[str]) -> SchemaTurn:
    """A constrained reply read back; anything off-schema (a server that did not enforce it, a reply
    cut by max_tokens) is `invalid` with the corrective observation."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return SchemaTurn("invalid", "", error=f"Format error: the reply is not one JSON object ({exc.msg}). "
                                               f"Answer with one option letter ({', '.join(letters)}).")
    if not isinstance(data, dict):
        return SchemaTurn("invalid", "", error="Format error: the reply must be one JSON object.")
    reasoning = data.get("reasoning") if isinstance(data.get("reasoning"), str) else ""
    action = data.get("action")
    if isinstance(action, dict) and action.get("answer") in letters:
        return SchemaTurn("response", reasoning, answer=action["answer"])
    if isinstance(action, dict) and action.get("tool") in tools:
        args = action.get("arguments") if isinstance(action.get("arguments"), dict) else {}
        return SchemaTurn("tool", reasoning, tool=action["tool"], arguments=args)
    return SchemaTurn("invalid", reasoning, error=(
        f"Format error: the action must be {{\"answer\": one of {', '.join(letters)}}}"
        + (f" or {{\"tool\": one of {', '.join(tools)}}}" if tools else "") + "."))


PROBE_SCHEMA = {"type": "object", "properties": {"word": {"type": "string", "enum": ["zebra-7"]}},
                "required": ["word"], "additionalProperties": False}
PROBE_MESSAGES = [{"role": "user", "content": "Say hello in one short sentence."}]


def probe_verdict(reply_text: str | None, rejected: bool) -> str:
    """`enforced` when a prompt that asks for prose still came back as the schema's only value."""
    if rejected:
        return "rejected"
    try:
        data = json.loads(reply_text or "")
    except json.JSONDecodeError:
        return "not-enforced"
    return "enforced" if isinstance(data, dict) and data.get("word") == "zebra-7" else "not-enforced"


async def probe_json_schema(transport, model: str) -> str:
    """Ask the server once whether it enforces `json_schema`: a prose request whose only schema-valid
    reply is a word the model would never write. `enforced`, `not-enforced`, `rejected` (400) or
    `unreachable`. Not an exchange of any case: its result is recorded in `run.started`."""
    from grandrounds.handlers.llm.transport import Call, TransportFailure

    # 64 tokens: llama.cpp's grammar lets the model indent the object; 16 cut it before the closing quote
    params = {"temperature": 0.0, "max_tokens": 64, "response_format": response_format(PROBE_SCHEMA, "Probe")}
    call = Call("probe", model, PROBE_MESSAGES, params, 1, "", "probe", "json-schema-probe")
    try:
        reply = await transport.send(call)
    except TransportFailure as exc:
        return "rejected" if exc.kind == "bad_request" else "unreachable"
    return probe_verdict(reply.text, False)
