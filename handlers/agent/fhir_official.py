"""The official MedAgentBench agent loop over the gateway (MedAgentBench `src/server/tasks/
medagentbench/__init__.py`, `start_sample`): one user message holds the whole task (the official
prompt with the function specs, context and question); every reply is judged by how it starts
(`protocol.parse_action`) and answered with the harness's texts; at most `max_rounds` replies (8 in
the official config).

Terminations, as the harness's statuses: `completed` (FINISH; its result is
`reply[len('FINISH('):-1]`), `invalid_action` (a reply that starts with none of GET/POST/FINISH),
`limit_reached` (no FINISH within the rounds), `error` (the model could not be reached). Only a
completed episode has a result, and only a result is graded.

`memory_prefix` (optional) puts a memory policy's items before the official prompt, in the same
user message, so a policy's gain is measured on the official protocol. `step_memory` (SELSM's per-step
retrieval) is asked before every reply with the trajectory state (`agent_state`: the question, then each
round's call and the harness's answer, as SELSM's judge rebuilds it from the recorded steps); its items
are appended to the user message that round is sent with, under "## Guidance for this step", and are
not kept in the conversation (as the tool-call loop re-renders its task each step), and their ids are
recorded as a `memory` step. Without either, the messages are the official harness's, byte for byte. The conversation is kept as
`AgentStep`s too (`reasoning`: the raw reply; `tool`: the executed call; `observation`: the harness's
answer; `response`: the FINISH result), which is what a `grandrounds run` records and grades from.
The SkeMex-protocol loop over the same tools is `fhir_react.run_fhir_agent`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from grandrounds.handlers.cases import FhirCaseView
from grandrounds.handlers.environments.medagentbench.protocol import (OFFICIAL_MAX_ROUNDS, OFFICIAL_PROMPT, Action,
                                                                      parse_action)
from grandrounds.handlers.environments.medagentbench.tools import FhirTools
from grandrounds.handlers.environments.medagentbench.trajectory import Message
from grandrounds.handlers.llm.errors import LLMUnavailable
from grandrounds.handlers.llm.gateway import LLMGateway
from grandrounds.handlers.llm.recorder import Recorder
from grandrounds.handlers.agent.step_memory import StepMemory, recall_step
from grandrounds.store.event_types import AgentStep

Termination = Literal["completed", "invalid_action", "limit_reached", "error"]
MEMORY_HEADER = "## Memory from earlier tasks"


@dataclass
class OfficialRun:
    status: Termination
    result: str | None = None
    rounds: int = 0
    actions: list[Action] = field(default_factory=list)
    steps: list[AgentStep] = field(default_factory=list)
    error: str | None = None


def official_prompt(view: FhirCaseView, api_base: str, functions_json: str, memory_prefix: str = "") -> str:
    prompt = OFFICIAL_PROMPT.format(api_base=api_base, functions=functions_json, context=view.context,
                                    question=view.instruction)
    return f"{MEMORY_HEADER}\n{memory_prefix}\n\n{prompt}" if memory_prefix else prompt


async def run_official_fhir_agent(gateway: LLMGateway, view: FhirCaseView, tools: FhirTools, recorder: Recorder,
                                  functions_json: str, max_rounds: int = OFFICIAL_MAX_ROUNDS,
                                  memory_prefix: str = "", step_memory: StepMemory | None = None) -> OfficialRun:
    """`functions_json`: the function specs as the harness shows them (json.dumps of funcs_v1.json)."""
    messages = [{"role": "user", "content": official_prompt(view, tools.public_base, functions_json, memory_prefix)}]
    history: list[Message] = []
    tools.trajectory.history = history
    run = OfficialRun("limit_reached")
    transitions: list[tuple[str, str]] = []
    for rnd in range(1, max_rounds + 1):
        sent = messages
        shown = recall_step(step_memory, view.question, transitions, run.steps)  # SELSM: before every reply
        if shown:
            sent = [*messages[:-1], {**messages[-1], "content": messages[-1]["content"] + shown}]
        try:
            reply = await gateway.complete(sent, recorder, f"fhir-round-{rnd}")
        except LLMUnavailable as exc:
            run.status, run.error, run.rounds = "error", f"model unavailable at round {rnd}: {exc}", rnd - 1
            return run
        run.rounds = rnd
        text = reply.text
        action = parse_action(text)
        run.actions.append(action)
        messages.append({"role": "assistant", "content": text})
        history.append(Message("agent", text))
        run.steps.append(AgentStep(kind="reasoning", content=text))
        if action.kind == "finish":
            tools.finish(action.result)
            run.status, run.result = "completed", action.result
            run.steps.append(AgentStep(kind="response", content=action.result))
            return run
        if action.kind == "invalid":
            run.status = "invalid_action"
            return run
        if action.kind == "get":
            observation = await tools.get_url(action.url)
        else:
            observation = tools.post_url(action.url, action.payload, action.payload_error)
        # The call executed; the environment records it again at the public base (`recorded_steps`).
        record = tools.trajectory.calls[-1].record()
        run.steps.append(AgentStep(kind="tool", content=record))
        run.steps.append(AgentStep(kind="observation", content=observation))
        transitions.append((f"call {record}", observation))  # as selsm.judge.decisions_of reads the round
        messages.append({"role": "user", "content": observation})
        history.append(Message("user", observation))
    return run
