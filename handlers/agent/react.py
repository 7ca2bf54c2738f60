"""The ReAct loop for MCQ cases: bounded steps, corrective observations, always an ending.

Each step renders the prompt (memory block + case + guarded history), asks the model once
through the gateway, and parses the turn. A tool turn runs the tool; a broken turn gets a
corrective observation; a valid response ends the loop. On the last step tools are
forbidden, and if the output still breaks the protocol its tag-stripped text is aligned to
an option (SkeMex's fallback): the reply's last explicit answer statement, else the option it
concludes with, never a guess. If even that fails, the case is answered with `NO_ANSWER` (source
`none`): graded wrong, and memory still learns from it. `CaseFailure` is left for outages.
With `actions="schema"` every turn is decoded against a JSON schema of its legal moves.
The recorded trajectory (`AgentStep`s) is complete: trimming is only in the prompt.
Every w steps RetroSum (`retrosum.py`: the policy's retrospection, else `summary_every`) writes a
retrospective summary; the actor's later prompts show it after the raw turns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from grandrounds.handlers.agent.guard import FINAL_NOTICE, GuardConfig, HistoryTurn, render
from grandrounds.handlers.agent.actions import SchemaTurn, mcq_action_schema, parse_schema_turn, response_format
from grandrounds.handlers.agent.protocol import Turn, fallback_alignment, parse_turn
from grandrounds.handlers.agent.retrosum import Retrospection, Retrospector, legacy
from grandrounds.handlers.cases import CaseView
from grandrounds.handlers.llm.errors import CaseFailure, LLMUnavailable
from grandrounds.handlers.llm.gateway import LLMGateway
from grandrounds.handlers.llm.recorder import Recorder
from grandrounds.handlers.tools import ToolBox
from grandrounds.handlers.agent.step_memory import SUMMARISER, StepMemory, recall_step, step_guidance  # noqa: F401
from grandrounds.store.event_types import AgentStep, AnswerGiven, MemoryRetrieved, ToolCall


SYSTEM = """You are a clinical reasoning agent answering a multiple-choice case.
Every turn: first <reasoning>...</reasoning>, then exactly ONE action:
  <tool>{{"name": "{tool_example}", "arguments": {{}}}}</tool>   to call one tool, or
  <response>C</response>   to give the final answer: exactly one option letter, here C.
Example of a final turn for a case whose right option were C:
<reasoning>Fever, neck stiffness and photophobia point to meningitis, option C.</reasoning>
<response>C</response>
Only one tool per turn. You have at most {max_steps} turns; on the last one tools are disabled.
Available tools: {tools}"""

SCHEMA_SYSTEM = """You are a clinical reasoning agent answering a multiple-choice case.
Every turn is one JSON object: "reasoning" (a few sentences weighing the findings against the options),
then "action": either {{"answer": "<one option letter>"}} to give your final answer, or
{{"tool": "<tool name>"}} to call one tool. You have at most {max_steps} turns; on the last one tools are disabled.
Available tools: {tools}"""

SCHEMA_FINAL_NOTICE = "[Final step: tools are disabled. Give your reasoning, then your final answer letter, now.]"

NO_ANSWER = ""
"""`AnswerGiven.answer` of a case whose agent gave no valid answer (source `none`): graded wrong."""


@dataclass(frozen=True)
class AgentConfig:
    max_steps: int = 7
    guard: GuardConfig = GuardConfig()
    summary_every: int = 10
    """RetroSum window w (the paper's 10): a summary after every w-th step; 0 turns it off.
    With the default 7 steps it never fires; set it below max_steps to use it."""
    actions: str = "text"
    """`text`: the tag protocol; `schema`: each turn decoded against a JSON schema of its legal moves
    (`handlers/agent/actions.py`; only where the server enforces json_schema)."""


def task_prompt(view: CaseView, memory: MemoryRetrieved) -> str:
    options = "\n".join(f"{k}) {v}" for k, v in view.options.items())
    block = f"## Memory\n{memory.prefix}\n\n" if memory.prefix else ""
    return f"{block}## Case (category: {view.category})\n{view.question}\n\nOptions:\n{options}"


def tools_line(toolbox: ToolBox, memory: MemoryRetrieved, schema: bool = False) -> str:
    if not toolbox.names:
        return "none — give your answer." if schema else "none — answer with <response>."
    labels = {g.tool: g.label for g in memory.tool_guidance}
    return "; ".join(f"{n} (governance: {labels.get(n, 'Caution')}; returns the option letter it supports)"
                     for n in toolbox.names)


def tool_step(turn: Turn) -> AgentStep:
    """A tool turn as the trajectory records it (MCQ and FHIR loops): canonical JSON of name and arguments."""
    return AgentStep(kind="tool", content=json.dumps({"name": turn.tool, "arguments": turn.arguments}, sort_keys=True))


async def run_mcq_agent(gateway: LLMGateway, view: CaseView, memory: MemoryRetrieved, toolbox: ToolBox,
                        recorder: Recorder, cfg: AgentConfig = AgentConfig(),
                        step_memory: StepMemory | None = None,
                        retrospection: Retrospection | None = None) -> AnswerGiven:
    """`retrospection`: the policy's own retrospective summaries (RetroSum); None: the loop's
    `summary_every` (`retrosum.legacy`)."""
    schema = cfg.actions == "schema"
    system = (SCHEMA_SYSTEM if schema else SYSTEM).format(
        max_steps=cfg.max_steps, tools=tools_line(toolbox, memory, schema),
        tool_example=toolbox.names[0] if toolbox.names else "tool name")
    letters = list(view.options)
    task = task_prompt(view, memory)  # rendered each step from memory; never part of the history
    labels = {g.tool: g.label for g in memory.tool_guidance}
    lessons = [i.text for i in memory.items if i.detail.get("audience") == SUMMARISER]  # RetroSum experience
    history: list[HistoryTurn] = []
    transitions: list[tuple[str, str]] = []
    steps: list[AgentStep] = []
    outputs: list[tuple[str, str | None]] = []
    retro = Retrospector(gateway, view, recorder, retrospection or legacy(cfg.summary_every), lessons)
    for step in range(1, cfg.max_steps + 1):
        final = step == cfg.max_steps
        shown = recall_step(step_memory, view.question, transitions, steps)  # SELSM: before every decision
        messages = render(system, task + shown, retro.actor_history(history), step, final, cfg.guard, retro.summary,
                          retro.header)
        if schema and final:
            messages[-1] = {**messages[-1], "content": messages[-1]["content"].replace(FINAL_NOTICE, SCHEMA_FINAL_NOTICE)}
        allowed = [] if final else toolbox.names
        params = {"response_format": response_format(mcq_action_schema(letters, allowed))} if schema else None
        try:
            reply = await gateway.complete(messages, recorder, f"react-step-{step}", params=params)
        except LLMUnavailable as exc:
            raise CaseFailure(f"model unavailable at step {step}: {exc}", steps) from None
        turn = (_from_schema(parse_schema_turn(reply.text, letters, allowed)) if schema
                else parse_turn(reply.text, view.options, toolbox.names, tools_allowed=not final))
        steps.append(AgentStep(kind="reasoning", content=turn.reasoning or reply.text))
        if turn.kind == "response":
            return await retro.closed(history, reply.text,
                                      _answer(turn.answer, ANSWER_SOURCE[turn.alignment], steps, outputs, labels))
        if final:
            letter, rule = fallback_alignment(reply.text, view.options)
            if letter is not None:
                steps.append(AgentStep(kind="observation", content=f"final step: answer read from the reply's {rule}"))
                return await retro.closed(history, reply.text,
                                          _answer(letter, f"llm:fallback:{rule}", steps, outputs, labels))
            steps.append(AgentStep(kind="observation", content=turn.error or "no answer"))
            return await retro.closed(history, reply.text, _no_answer(f"no valid answer after {cfg.max_steps} steps",
                                                                       steps, outputs, labels))
        if turn.kind == "tool":
            out = toolbox.call(turn.tool)
            observation = f"{turn.tool} -> {out if out else 'no result'}"
            outputs.append((turn.tool, out))
            steps.append(tool_step(turn))
            finding = out is not None
            transitions.append((f"call {turn.tool}", observation))
        else:
            observation, finding = turn.error or "format error", False
            transitions.append(("invalid action", observation))
        steps.append(AgentStep(kind="observation", content=observation))
        history.append(HistoryTurn(reply.text, observation, turn.signature, finding))
        await retro.after_step(step, final, history, steps)
    return _no_answer(f"no valid answer after {cfg.max_steps} steps", steps, outputs, labels)  # max_steps < 1


ANSWER_SOURCE = {"tag": "llm", "statement": "llm:statement", "conclusion": "llm:conclusion", "schema": "llm:schema"}
"""`AnswerGiven.source` by how the answer was read: inside <response> (`llm`, as before), an explicit
statement outside the tags, the option an untagged reply concludes with, the constrained JSON action; the last step's fallback records
`llm:fallback:statement` or `llm:fallback:conclusion`; `none` when the agent gave no answer."""


def _from_schema(t: SchemaTurn) -> Turn:
    return Turn(t.kind, t.reasoning, tool=t.tool, arguments=t.arguments or {}, answer=t.answer, error=t.error,
                alignment="schema" if t.kind == "response" else None)


def _no_answer(reason: str, steps: list[AgentStep], outputs: list[tuple[str, str | None]],
               labels: dict[str, str]) -> AnswerGiven:
    """A case the agent could not answer still gets graded (wrong) and reflected on: errors teach memory."""
    steps.append(AgentStep(kind="observation", content=reason))
    calls = [ToolCall(tool=t, label=labels.get(t, "Caution"), output=o, adopted=False) for t, o in outputs]
    return AnswerGiven(answer=NO_ANSWER, source="none", steps=steps, tool_calls=calls)


def _answer(letter: str, source: str, steps: list[AgentStep], outputs: list[tuple[str, str | None]],
            labels: dict[str, str]) -> AnswerGiven:
    steps.append(AgentStep(kind="response", content=letter))
    calls = [ToolCall(tool=t, label=labels.get(t, "Caution"), output=o, adopted=o is not None and o == letter)
             for t, o in outputs]
    return AnswerGiven(answer=letter, source=source, steps=steps, tool_calls=calls)
