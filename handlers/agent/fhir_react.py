"""The ReAct loop for MedAgentBench FHIR cases, and a `sim` agent that runs the same path offline.

Same SkeMex protocol as the MCQ loop (`<reasoning>` then one `<tool>{json}</tool>` or `<response>`),
same context guard and step bound; the tools are the benchmark's FHIR functions (`funcs_v1.json`)
executed by `FhirTools` against the sandbox or a real server (`--fhir-base`), and the answer is the
benchmark's `FINISH([...])` list. The FHIR calls land in `tools.trajectory`, which is what grading
reads (accepted POSTs and the FINISH payload), as the official evaluation does.
`grandrounds run --env medagentbench` runs it as the act stage of the openai backbone (and
`sim_fhir_agent` as the sim's), with the run's memory in the task prompt's memory block.
With `actions="schema"` each turn is decoded against a JSON schema of its legal moves instead
(`handlers/agent/actions.py`: reasoning, then a call of one function allowed now with that function's
own arguments, or the FINISH list; on the last step only FINISH).
"""

from __future__ import annotations

import json
import re
from datetime import datetime

from grandrounds.handlers.agent.actions import FHIR_SCHEMA_NAME, fhir_action_schema, parse_fhir_schema_turn, response_format
from grandrounds.handlers.agent.guard import FINAL_NOTICE, HistoryTurn, render
from grandrounds.handlers.agent.protocol import _TAG, Turn
from grandrounds.handlers.agent.react import AgentConfig, tool_step
from grandrounds.handlers.agent.retrosum import NO_RETROSPECTION, Retrospection, Retrospector
from grandrounds.handlers.cases import FhirCaseView
from grandrounds.handlers.environments.medagentbench import NOW, TASK8_COMMENT, FhirTools, calculate_age, finish_payload
from grandrounds.handlers.llm.errors import CaseFailure, LLMUnavailable
from grandrounds.handlers.llm.gateway import LLMGateway
from grandrounds.handlers.llm.recorder import Recorder
from grandrounds.handlers.agent.step_memory import StepMemory, agent_state, recall_step
from grandrounds.store.event_types import AgentStep, AnswerGiven

FHIR_SYSTEM = """You are an expert in using FHIR functions to assist medical professionals.
Every turn: first <reasoning>...</reasoning>, then exactly ONE action:
  <tool>{{"name": "<function name>", "arguments": {{...}}}}</tool>   to call one FHIR function
      (GET: the arguments are the query parameters; POST: the arguments are the JSON payload), or
  <response>FINISH([answer1, answer2, ...])</response>   when all requested tasks are done
      (a JSON list; use FINISH([]) when nothing is asked back).
Only one action per turn. You have at most {max_steps} turns; on the last one functions are disabled.
Available functions:
{functions}"""

FHIR_FINAL_NOTICE = ("[Final step: functions are disabled. Give <reasoning>...</reasoning> and then "
                     "<response>FINISH([...])</response> now.]")


FHIR_SCHEMA_SYSTEM = """You are an expert in using FHIR functions to assist medical professionals.
Every turn is one JSON object: "reasoning" (a few sentences on what you know and what is left to do), then
"action": either {{"tool": "<function name>", "arguments": {{...}}}} to call one FHIR function (GET: the
arguments are the query parameters; POST: the arguments are the JSON payload), or {{"finish": [...]}} when all
requested tasks are done (the answers the question asks for, as in FINISH([...]); [] when nothing is asked back).
You have at most {max_steps} turns; on the last one functions are disabled.
Available functions:
{functions}"""

FHIR_SCHEMA_FINAL_NOTICE = "[Final step: functions are disabled. Give your reasoning, then your finish list, now.]"


def functions_block(tools: FhirTools) -> str:
    lines = []
    for f in tools.functions.values():
        summary = f.description.split("\n")[0][:300]
        lines.append(f"- {f.name} ({f.method} {f.resource}): {summary}\n  parameters: {json.dumps(f.parameters)}")
    return "\n".join(lines)


def fhir_memory_block(prefix: str) -> str:
    """A policy's rendered memory without the MCQ base protocol it opens with (it asks for an option
    letter; the FHIR system prompt is the protocol here). Empty when nothing else is in memory."""
    from grandrounds.handlers.agent.protocol import BASE_PROTOCOL

    head = f"## Protocol\n{BASE_PROTOCOL}"
    if prefix.startswith(head):
        prefix = prefix[len(head):]
    return prefix.strip("\n")


def fhir_task_prompt(view: FhirCaseView, memory_prefix: str = "") -> str:
    block = f"## Memory\n{memory_prefix}\n\n" if memory_prefix else ""
    return f"{block}## Context\n{view.context}\n\n## Question\n{view.instruction}"


def parse_fhir_turn(text: str, tools: list[str], tools_allowed: bool = True) -> Turn:
    reasoning = " ".join(m.strip() for m in _TAG["reasoning"].findall(text))
    found, responses = _TAG["tool"].findall(text), _TAG["response"].findall(text)
    if len(found) + len(responses) == 0:
        return Turn("invalid", reasoning, error=(
            "Format error: missing action. After <reasoning>...</reasoning> give exactly one "
            "<tool>{\"name\": ..., \"arguments\": {...}}</tool> or <response>FINISH([...])</response>."))
    if len(found) + len(responses) > 1:
        return Turn("invalid", reasoning, error="Format error: exactly one action per turn (one <tool> or one <response>).")
    if responses:  # the benchmark ends at FINISH whatever it holds; grading judges the payload
        return Turn("response", reasoning, answer=finish_payload(responses[0]))
    if not tools_allowed:
        return Turn("invalid", reasoning, error="Functions are disabled on the final step: give <response>FINISH([...])</response>.")
    try:
        data = json.loads(found[0])
    except json.JSONDecodeError as exc:
        return Turn("invalid", reasoning, error=f"Parse error: the <tool> block is not valid JSON ({exc.msg} at column {exc.colno}).")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not isinstance(data.get("arguments", {}), dict):
        return Turn("invalid", reasoning, error='Parse error: the <tool> JSON must be {"name": "<function>", "arguments": {...}}.')
    if data["name"] not in tools:
        return Turn("invalid", reasoning, error=f"Tool error: unknown function {data['name']!r}; available: {', '.join(tools)}.")
    return Turn("tool", reasoning, tool=data["name"], arguments=data.get("arguments", {}))


async def run_fhir_agent(gateway: LLMGateway, view: FhirCaseView, tools: FhirTools, recorder: Recorder,
                         cfg: AgentConfig = AgentConfig(), memory_prefix: str = "",
                         step_memory: StepMemory | None = None, retrospection: Retrospection | None = None,
                         lessons: list[str] | None = None) -> AnswerGiven:
    """`step_memory`: per-step retrieval (SELSM), called before every decision with the trajectory
    state, as the MCQ loop does; its items are shown under "## Guidance for this step" and recorded
    as a `memory` step (their ids). `retrospection`: RetroSum's retrospective summaries, as in the MCQ
    loop (None: none, as in every FHIR run before issue 44; `--summary-every` is the MCQ loop's); `lessons`: the summariser lessons retrieved for the task."""
    schema = cfg.actions == "schema"
    system = (FHIR_SCHEMA_SYSTEM if schema else FHIR_SYSTEM).format(max_steps=cfg.max_steps,
                                                                   functions=functions_block(tools))
    notice = FHIR_SCHEMA_FINAL_NOTICE if schema else FHIR_FINAL_NOTICE
    parameters = {name: f.parameters for name, f in tools.functions.items()}
    task = fhir_task_prompt(view, memory_prefix)
    history: list[HistoryTurn] = []
    transitions: list[tuple[str, str]] = []
    steps: list[AgentStep] = []
    retro = Retrospector(gateway, view, recorder, retrospection or NO_RETROSPECTION, lessons)
    for step in range(1, cfg.max_steps + 1):
        final = step == cfg.max_steps
        shown = recall_step(step_memory, view.question, transitions, steps)  # SELSM: before every decision
        messages = [{**m, "content": m["content"].replace(FINAL_NOTICE, notice)}
                    for m in render(system, task + shown, retro.actor_history(history), step, final, cfg.guard,
                                    retro.summary, retro.header)]
        allowed = [] if final else tools.names
        params = ({"response_format": response_format(fhir_action_schema(parameters, allowed), FHIR_SCHEMA_NAME)}
                  if schema else None)
        try:
            reply = await gateway.complete(messages, recorder, f"fhir-step-{step}", params=params)
        except LLMUnavailable as exc:
            raise CaseFailure(f"model unavailable at step {step}: {exc}", steps) from None
        if schema:
            t = parse_fhir_schema_turn(reply.text, allowed)
            turn = Turn(t.kind, t.reasoning, tool=t.tool, arguments=t.arguments or {}, answer=t.answer, error=t.error)
        else:
            turn = parse_fhir_turn(reply.text, tools.names, tools_allowed=not final)
        steps.append(AgentStep(kind="reasoning", content=turn.reasoning or reply.text))
        if turn.kind == "response":
            tools.finish(turn.answer)
            steps.append(AgentStep(kind="response", content=turn.answer))
            return await retro.closed(history, reply.text, AnswerGiven(
                answer=turn.answer, source="llm:schema" if schema else "llm", steps=steps))
        if turn.kind == "tool":
            observation = await tools.call(turn.tool, turn.arguments)
            steps.append(tool_step(turn))
            finding = not observation.startswith(("Error", "Invalid"))
            transitions.append((f"call {turn.tool}", observation))
        else:
            observation, finding = turn.error or "format error", False
            transitions.append(("invalid action", observation))
        steps.append(AgentStep(kind="observation", content=observation))
        history.append(HistoryTurn(reply.text, observation, turn.signature, finding))
        await retro.after_step(step, final, history, steps)
    raise CaseFailure(f"no FINISH after {cfg.max_steps} steps", steps, "turn_limit")


# -- sim ---------------------------------------------------------------------------------------

_MRN = re.compile(r"\b(S\d{7})\b")
_NAME_DOB = re.compile(r"name (.+?) and DOB of (\d{4}-\d{2}-\d{2})")
_BP = re.compile(r'"(\d+/\d+ mmHg)"')


async def sim_fhir_agent(view: FhirCaseView, tools: FhirTools, step_memory: StepMemory | None = None) -> AnswerGiven:
    """A scripted, deterministic agent that follows the official task templates: it solves task types
    1, 2, 3 and 8 through the FHIR functions (so the whole path runs offline) and answers the lab tasks
    from whatever the server returns (the sandbox has no labs, so those come back as [-1] / no order).
    With per-step retrieval (SELSM) it retrieves once, from the query state, as the MCQ sim does, and
    records what was retrieved; being scripted, it does not act on it."""
    steps: list[AgentStep] = []
    if step_memory is not None:
        shown = step_memory(agent_state(view.question, []))
        steps.append(AgentStep(kind="memory", content=",".join(i.item_id for i in shown)))

    async def call(name: str, args: dict) -> str:
        steps.append(AgentStep(kind="tool", content=json.dumps({"name": name, "arguments": args}, sort_keys=True)))
        out = await tools.call(name, args)
        steps.append(AgentStep(kind="observation", content=out[:2000]))
        return out

    def entries(observation: str) -> list[dict]:
        raw = observation.split("\n", 1)[1].rsplit(". Please call FINISH", 1)[0] if "\n" in observation else "{}"
        try:
            return [e["resource"] for e in json.loads(raw).get("entry", [])]
        except json.JSONDecodeError:
            return []

    q, mrn_m = view.instruction, _MRN.search(view.instruction)
    mrn = mrn_m.group(1) if mrn_m else None
    t = view.task_type
    if t == 1 and (m := _NAME_DOB.search(q)):
        given, _, family = m.group(1).rpartition(" ")
        found = entries(await call("get_patient", {"given": given or family, "family": family, "birthdate": m.group(2)}))
        result = json.dumps([found[0]["id"]] if found else ["Patient not found"])
    elif t == 2 and mrn:
        found = entries(await call("get_patient", {"identifier": mrn}))
        result = json.dumps([calculate_age(datetime.strptime(found[0]["birthDate"], "%Y-%m-%d"))] if found else [])
    elif t == 3 and mrn and (bp := _BP.search(q)):
        await call("post_observation", {
            "resourceType": "Observation",
            "category": [{"coding": [{"system": "http://hl7.org/fhir/observation-category", "code": "vital-signs",
                                      "display": "Vital Signs"}]}],
            "code": {"text": "BP"}, "effectiveDateTime": NOW, "status": "final", "valueString": bp.group(1),
            "subject": {"reference": f"Patient/{mrn}"}})
        result = "[]"
    elif t == 8 and mrn:
        await call("post_servicerequest", {
            "resourceType": "ServiceRequest",
            "code": {"coding": [{"system": "http://snomed.info/sct", "code": "306181000000106",
                                 "display": "Orthopedic surgery referral"}]},
            "authoredOn": NOW, "status": "active", "intent": "order", "priority": "stat",
            "note": {"text": TASK8_COMMENT}, "subject": {"reference": f"Patient/{mrn}"}})
        result = "[]"
    else:
        code = re.search(r'code for \w+ is "(\w+)"', view.context or "")
        if mrn and code:
            await call("get_observation_labs", {"patient": mrn, "code": code.group(1)})
        result = "[-1]"
    steps.append(AgentStep(kind="response", content=result))
    tools.finish(result)
    return AnswerGiven(answer=result, source="sim:fhir", steps=steps)
