"""Structured agent actions: each turn decoded against a JSON schema of that turn's legal moves.

Where the server enforces `response_format: json_schema` (llama.cpp, vLLM and OpenAI do; probed
once per run by `probe_json_schema` and recorded in `run.started`), an MCQ turn is one JSON object:
`reasoning` first (the model thinks before it commits), then exactly one `action`: a tool call
(`tool` an enum of the tools allowed at this step) or a response (`answer` an enum of the option
letters). On the last step the schema offers only the response. The model cannot copy a
placeholder or invent a tag variant: an answer it gives is one of the letters, by construction.
The same for the AgentClinic doctor (a question, a test or the diagnosis, rendered back into
AgentClinic's words) and the react FHIR loop (a call of one allowed function with its own arguments,
or the FINISH list); the official MedAgentBench protocol is never schema-decoded.
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


def _envelope(text: str, hint: str) -> tuple[str, object] | str:
    """A schema turn's JSON envelope: (reasoning, action), or the format error to send back (`hint`
    names the legal moves). Shared by the MCQ, OSCE and FHIR turn readers."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"Format error: the reply is not one JSON object ({exc.msg}). {hint}"
    if not isinstance(data, dict):
        return "Format error: the reply must be one JSON object."
    reasoning = data.get("reasoning") if isinstance(data.get("reasoning"), str) else ""
    return reasoning, data.get("action")


def parse_schema_turn(text: str, letters: list[str], tools: list[str]) -> SchemaTurn:
    """A constrained reply read back; anything off-schema (a server that did not enforce it, a reply
    cut by max_tokens) is `invalid` with the corrective observation."""
    decoded = _envelope(text, f"Answer with one option letter ({', '.join(letters)}).")
    if isinstance(decoded, str):
        return SchemaTurn("invalid", "", error=decoded)
    reasoning, action = decoded
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


# -- AgentClinic OSCE doctor turns ---------------------------------------------------------------
# The official doctor speaks text: a question, "REQUEST TEST: X" or "DIAGNOSIS READY: Y". A schema
# turn is one of those three moves as JSON, rendered back into that text form (`render_doctor_move`)
# before the patient, the measurement tool or the judge see it, so grading stays AgentClinic's.
# The test is free text, as officially: the doctor is never shown the case's recorded test names.

DOCTOR_SCHEMA_NAME = "DoctorTurn"


def osce_action_schema(final: bool) -> dict[str, Any]:
    """Reasoning, then one move: `question`, `test` or `diagnosis`; on the last turn only `diagnosis`."""
    def move(key: str) -> dict[str, Any]:
        return {"type": "object", "properties": {key: {"type": "string", "minLength": 1}},
                "required": [key], "additionalProperties": False}

    action: dict[str, Any] = move("diagnosis") if final else {"anyOf": [move("question"), move("test"),
                                                                        move("diagnosis")]}
    return {"type": "object",
            "properties": {"reasoning": {"type": "string", "maxLength": REASONING_CHARS}, "action": action},
            "required": ["reasoning", "action"], "additionalProperties": False}


@dataclass(frozen=True)
class DoctorMove:
    kind: Literal["question", "test", "diagnosis", "invalid"]
    reasoning: str
    text: str = ""
    """The question, the test name or the diagnosis; for `invalid` the corrective observation."""


def render_doctor_move(move: DoctorMove) -> str:
    """The move in AgentClinic's own words, as the official doctor would have said it."""
    if move.kind == "diagnosis":
        return f"DIAGNOSIS READY: {move.text}"
    if move.kind == "test":
        return f"REQUEST TEST: {move.text}"
    return move.text


def parse_osce_turn(text: str, final: bool) -> DoctorMove:
    """A constrained doctor reply read back; anything off-schema is `invalid` with the corrective
    observation (the turn is spent, nothing reaches the patient)."""
    legal = '{"diagnosis": ...}' if final else '{"question": ...}, {"test": ...} or {"diagnosis": ...}'
    decoded = _envelope(text, f"Give \"reasoning\", then \"action\": {legal}.")
    if isinstance(decoded, str):
        return DoctorMove("invalid", "", decoded)
    reasoning, action = decoded
    keys = ("diagnosis",) if final else ("question", "test", "diagnosis")
    if isinstance(action, dict) and len(action) == 1:
        (key, value), = action.items()
        if key in keys and isinstance(value, str) and value.strip():
            return DoctorMove(key, reasoning, value.strip())  # type: ignore[arg-type]
    return DoctorMove("invalid", reasoning, f"Format error: the action must be exactly one of {legal}"
                                            + (" (this is the final turn: give your diagnosis)." if final else "."))


# -- MedAgentBench FHIR functions in the SkeMex-style loop -----------------------------------------
# Only the react loop (`fhir_react.py`); the official protocol stays the benchmark's verbatim text.

FHIR_SCHEMA_NAME = "FhirTurn"


def _without_descriptions(schema: Any) -> Any:
    """A function's parameter schema without its prose (the prompt lists it already): the grammar and
    the recorded request stay small. A property *named* description is a schema (a dict), and stays."""
    if isinstance(schema, dict):
        return {k: _without_descriptions(v) for k, v in schema.items()
                if not (k == "description" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_without_descriptions(v) for v in schema]
    return schema


def fhir_action_schema(parameters: dict[str, dict[str, Any]], allowed: list[str]) -> dict[str, Any]:
    """Reasoning, then one action: a call of one of the functions allowed now (`tool` an enum of that
    one name, `arguments` that function's own parameter schema) or `finish` (the FINISH list). On the
    last step (`allowed` empty) only `finish`."""
    finish = {"type": "object",
              "properties": {"finish": {"type": "array",
                                        "items": {"anyOf": [{"type": "string"}, {"type": "number"}]}}},
              "required": ["finish"], "additionalProperties": False}
    calls = [{"type": "object",
              "properties": {"tool": {"type": "string", "enum": [name]},
                             "arguments": _without_descriptions(parameters.get(name) or {"type": "object"})},
              "required": ["tool", "arguments"], "additionalProperties": False} for name in allowed]
    action: dict[str, Any] = {"anyOf": [*calls, finish]} if calls else finish
    return {"type": "object",
            "properties": {"reasoning": {"type": "string", "maxLength": REASONING_CHARS}, "action": action},
            "required": ["reasoning", "action"], "additionalProperties": False}


def parse_fhir_schema_turn(text: str, allowed: list[str]) -> SchemaTurn:
    """`response` carries the FINISH list as the text protocol would have written it (`json.dumps`),
    so grading reads the same payload either way; off-schema is `invalid` with the corrective observation."""
    legal = (f'{{"tool": one of {", ".join(allowed)}, "arguments": {{...}}}} or ' if allowed else "") + '{"finish": [...]}'
    decoded = _envelope(text, f"Give \"reasoning\", then \"action\": {legal}.")
    if isinstance(decoded, str):
        return SchemaTurn("invalid", "", error=decoded)
    reasoning, action = decoded
    if isinstance(action, dict) and isinstance(action.get("finish"), list) and len(action) == 1:
        return SchemaTurn("response", reasoning, answer=json.dumps(action["finish"]))
    if isinstance(action, dict) and action.get("tool") in allowed and isinstance(action.get("arguments", {}), dict):
        return SchemaTurn("tool", reasoning, tool=action["tool"], arguments=action.get("arguments", {}))
    final = "" if allowed else " (functions are disabled on the final step)"
    return SchemaTurn("invalid", reasoning, error=f"Format error: the action must be {legal}{final}.")
