"""The `agent` backbone: a user's own agent answers, and its replies are recorded like a model's.

A team that has its own clinical agent (a Python loop, LangGraph, a hospital pipeline) plugs it in
as a callable `agent(case, memory)`: `case` is the case as the agent may see it (`CaseView`, no gold
answer), `memory` the recalled context (`AgentMemory`: the rendered text and the items, with ids,
kinds, relevance and why they were chosen). It returns an option letter (`"B"`) or an `AgentReply`
(answer, trajectory, the memory items it relied on, token usage), sync or async.

The call goes through the one gateway (DESIGN §3) as an exchange: the request is the canonical JSON of
what the agent was shown, the response the canonical JSON of its reply. So a run made with an agent is
re-executed (`grandrounds verify`) and replayed in its own order without the agent: the record backend
serves its replies by request hash. A replay that changes what memory shows (a permutation, another
policy) asks the agent something it was never asked: that needs the agent again (`--agent`), and a
replay without it stops with a divergence that says so.

Reflection and the policies' model tasks (distillation, judging) run offline, with the `sim` backbone's
deterministic reflector: the user's agent answers; the memory learns from the graded outcome.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Awaitable, Callable, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grandrounds.handlers.backbones.base import CaseFailure
from grandrounds.handlers.backbones.sim import SimBackbone, rule_text
from grandrounds.handlers.text import key_terms
from grandrounds.handlers.cases import Case, CaseView
from grandrounds.handlers.llm.errors import LLMUnavailable, ReplayDivergence
from grandrounds.handlers.llm.gateway import LLMGateway, RetryPolicy
from grandrounds.handlers.llm.record import RecordedExchanges, RecordedTransport
from grandrounds.handlers.llm.recorder import Recorder
from grandrounds.handlers.llm.transport import Call, RawReply, TransportFailure
from grandrounds.handlers.tools import ToolBox
from grandrounds.store.canonical import canonical_json
from grandrounds.store.event_types import (AgentStep, AnswerGiven, FeedbackRecorded, MemoryRetrieved, ReflectionRecorded,
                                           RuleEditProposal)
from grandrounds.store.llm_events import TokenUsage

AGENT_PROTOCOL = "grandrounds-agent/1"
"""The system message of every agent exchange: names the request/reply shapes below, so a change of
them is a new protocol (and a new request hash), never a silent reinterpretation of old records."""
AGENT_PARAMS: dict[str, Any] = {"protocol": AGENT_PROTOCOL, "max_tokens": None}
"""Sent (recorded) with every agent exchange. `max_tokens: None` says plainly that no token bound
applies to a user's agent (the gateway would otherwise add its model default)."""
AGENT_NOTE = ("agent backbone: answers by agent {name}, replies recorded (verify and same-order replay need "
              "no agent); reflection by the offline sim reflector")
AGENT_SOURCE = "agent"
"""`answer.given.source` of an answer the agent decided without naming a memory item it relied on."""
NO_ANSWER = ""
"""The recorded answer of a case the agent gave no valid answer to (as the ReAct agent's `NO_ANSWER`;
not imported from handlers/agent, which sits above the backbones)."""


class RecalledItem(BaseModel):
    """One memory item as shown to the agent: what `memory.retrieved` recorded for it, flattened."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ref: str
    """`<kind>:<id>` (`rule:r-3f2a…`, `episode:e-…`, `tool:xray`, `skill:…`): what an `AgentReply.used`
    names, and the `answer.given.source` when the agent relied on it."""
    kind: str
    """`rule`, `episode`, `tool` (governance label) or a policy's item kind (`skill`, `logical-skill`, ...)."""
    item_id: str
    text: str
    """The text rendered to the agent (a tool's governance label for `tool`)."""
    relevance: float = 0.0
    """Cosine relevance to the case, as the policy computed it (0 for tool guidance)."""
    score: float = 0.0
    """The selection score that ranked it (relevance blended with utility, priority, recency...)."""
    why: dict[str, Any] = Field(default_factory=dict)
    """Why it was chosen, as recorded: priority and utility of a rule, the source case of an episode,
    a skill's branch and utility, ... (the policy's own fields)."""


class AgentMemory(BaseModel):
    """What the agent is shown of memory for one case: the rendered context and its items."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_seq: int
    """The memory version read (seq of the last event folded in): `as_of(memory_seq)` shows it whole."""
    text: str
    """The context prefix to put in front of the agent's prompt (protocol, governance, rules, episodes)."""
    items: list[RecalledItem] = Field(default_factory=list)


class AgentReply(BaseModel):
    """What the agent did on a case. A plain option letter returned by the agent means `AgentReply(answer=letter)`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    answer: str = Field(min_length=1)
    """The option letter chosen. One that is not an option is recorded as no answer (graded wrong)."""
    steps: list[AgentStep] = Field(default_factory=list)
    """The trajectory: reasoning, tool calls, observations ... (recorded with the answer)."""
    used: list[str] = Field(default_factory=list)
    """Refs (`rule:<id>`, `skill:<id>`) of shown memory items the answer relied on: the first one shown
    becomes the answer's source, which is how the policies credit or blame an item."""
    usage: TokenUsage | None = None
    """The agent's own model token usage for the case (tokens per correct task is a reported metric)."""


AgentResult = Union[str, AgentReply, dict]
AgentCallable = Callable[[CaseView, AgentMemory], Union[AgentResult, Awaitable[AgentResult]]]


def recalled_items(memory: MemoryRetrieved) -> list[RecalledItem]:
    """Every item `memory.retrieved` records, in the order the context shows them (rules, episodes,
    tool guidance, then other policies' items)."""
    out = [RecalledItem(ref=f"rule:{r.rule_id}", kind="rule", item_id=r.rule_id, text=r.text, relevance=r.relevance,
                        score=r.score, why={"priority": r.priority, "utility": r.utility, "trigger": list(r.trigger)})
           for r in memory.rules]
    out += [RecalledItem(ref=f"episode:{e.episode_id}", kind="episode", item_id=e.episode_id, text=e.guideline,
                         relevance=e.relevance, score=e.relevance,
                         why={"source_case_id": e.source_case_id, "summary": e.summary, "trigger": list(e.trigger)})
            for e in memory.episodes]
    out += [RecalledItem(ref=f"tool:{g.tool}", kind="tool", item_id=g.tool, text=g.label, why={"label": g.label})
            for g in memory.tool_guidance]
    out += [RecalledItem(ref=f"{i.kind}:{i.item_id}", kind=i.kind, item_id=i.item_id, text=i.text,
                         relevance=i.relevance, score=i.score, why={**i.detail, "trigger": list(i.trigger)})
            for i in memory.items]
    return out


def agent_memory(memory: MemoryRetrieved) -> AgentMemory:
    return AgentMemory(memory_seq=memory.memory_seq, text=memory.prefix, items=recalled_items(memory))


def agent_messages(view: CaseView, memory: AgentMemory) -> list[dict[str, str]]:
    """The recorded request: exactly what the agent is shown, as canonical JSON (its hash is the key)."""
    body = {"case": view.model_dump(mode="json"), "memory": memory.model_dump(mode="json")}
    return [{"role": "system", "content": AGENT_PROTOCOL}, {"role": "user", "content": canonical_json(body)}]


def as_reply(result: Any) -> AgentReply:
    """An agent's return value as an `AgentReply`: a letter, a dict of its fields, or the model itself."""
    if isinstance(result, AgentReply):
        return result
    if isinstance(result, str):
        return AgentReply(answer=result.strip() or result)
    if isinstance(result, dict):
        return AgentReply.model_validate(result)
    raise TypeError(f"an agent returns an option letter, an AgentReply or a dict of its fields, not "
                    f"{type(result).__name__}")


class CallableTransport:
    """Asks the user's agent: decodes the request the gateway is about to record (our own canonical JSON,
    validated, nothing executed) back into the agent's arguments and returns its reply as canonical JSON."""

    served = "live"

    def __init__(self, agent: AgentCallable, name: str):
        self.agent = agent
        self.endpoint = f"agent {name}"

    async def send(self, call: Call) -> RawReply:
        body = json.loads(call.messages[-1]["content"])
        view, memory = CaseView.model_validate(body["case"]), AgentMemory.model_validate(body["memory"])
        result = self.agent(view, memory)
        if inspect.isawaitable(result):
            result = await result
        try:
            reply = as_reply(result)
        except (ValidationError, TypeError) as exc:
            # The agent's answer to this request, recorded as a refusal (replayed the same way): the case
            # fails and the run goes on, as for a model whose output cannot be used.
            raise TransportFailure("bad_request", f"the agent's reply is not an AgentReply: {exc}"[:500], False)
        return RawReply(canonical_json(reply.model_dump(mode="json", exclude_none=True)), "stop", reply.usage)

    async def aclose(self) -> None:
        return None


class AgentBackbone:
    """Acts through a user's agent (live, or its recorded replies); reflects offline (the sim reflector)."""

    name = "agent"
    records_exchanges = True

    def __init__(self, gateway: LLMGateway, note: str, live: bool):
        self.gateway = gateway
        self.model = gateway.model
        self.note = note
        self.live = live
        """Whether the agent itself can be asked (False: only its recorded replies)."""
        self._reflector = SimBackbone()

    async def act(self, view: CaseView, memory: MemoryRetrieved, toolbox: ToolBox, rng: np.random.Generator,
                  recorder: Recorder | None = None, step_memory=None) -> AnswerGiven:
        # `step_memory` (SELSM's per-step retrieval) is not offered: the contract is one call per case,
        # with the memory recalled before it; the agent sees what `memory.retrieved` records.
        if recorder is None:
            raise ValueError("the agent backbone records every reply: the stage must pass a recorder")
        shown = agent_memory(memory)
        try:
            reply = await self.gateway.complete(agent_messages(view, shown), recorder, "agent-reply", AGENT_PARAMS)
        except LLMUnavailable as exc:
            raise CaseFailure(f"agent reply unusable: {exc}") from None
        except ReplayDivergence as exc:
            if self.live:
                raise
            raise ReplayDivergence(f"{exc}. The agent was shown memory it was never shown when the run was "
                                   "recorded: give the agent again (--agent module:callable) to ask it") from None
        return answer_of(AgentReply.model_validate_json(reply.text), view, shown)

    async def reflect(self, case: Case, memory: MemoryRetrieved, answer: AnswerGiven, feedback: FeedbackRecorded,
                      recorder: Recorder | None = None) -> ReflectionRecorded:
        if answer.answer not in case.options:
            return no_answer_reflection(case)
        return await self._reflector.reflect(case, memory, answer, feedback)

    async def solve(self, task, recorder: Recorder | None = None):
        return await self._reflector.solve(task)

    async def aclose(self) -> None:
        await self.gateway.aclose()


def answer_of(reply: AgentReply, view: CaseView, shown: AgentMemory) -> AnswerGiven:
    """The `answer.given` of a reply: its source is the first shown item it says it relied on."""
    refs = {i.ref for i in shown.items}
    source = next((u for u in reply.used if u in refs), AGENT_SOURCE)
    steps = list(reply.steps)
    if reply.answer not in view.options:
        # Never a guess: an answer outside the options is no answer, graded wrong and reflected on.
        steps.append(AgentStep(kind="reasoning", content=f"agent answered {reply.answer[:80]!r}: not one of "
                                                         f"{', '.join(sorted(view.options))}"))
        return AnswerGiven(answer=NO_ANSWER, source="none", steps=steps)
    if not steps or steps[-1].kind != "response":
        steps.append(AgentStep(kind="response", content=reply.answer))
    return AnswerGiven(answer=reply.answer, source=source, steps=steps)


def no_answer_reflection(case: Case) -> ReflectionRecorded:
    """The sim reflector's corrective lesson for a case the agent gave no valid answer to (the sim reflector
    itself only meets answers among the options): errors teach memory too."""
    gold_text = case.options[case.answer]
    terms = key_terms(case.question)
    return ReflectionRecorded(
        summary=f"[{case.category}] The agent gave no valid answer; correct was {case.answer} ('{gold_text}').",
        guideline=f"When a case presents with {', '.join(terms[:6])}, the answer is '{gold_text}'.",
        edits=[RuleEditProposal(op="add", text=rule_text(terms, gold_text), trigger=terms, priority=0,
                                reason="corrective rule after no valid answer")])


def build_agent_backbone(name: str, model: str | None, *, agent: AgentCallable | None = None,
                         recorded: RecordedExchanges | None = None, live_fallthrough: bool = False,
                         **_ignored: Any) -> AgentBackbone:
    """`name`: the registered name (`agent`). `agent`: the callable (live). `recorded`: a run's replies
    served by request hash; with the agent too and `live_fallthrough`, a request the record lacks asks
    the agent (a counterfactual replay)."""
    from grandrounds.handlers.backbones import BackboneUnavailable

    if not model:
        raise BackboneUnavailable("the agent backbone needs the agent's name (--model, or the module:callable)")
    live = CallableTransport(agent, model) if agent is not None else None
    if recorded is not None:
        transport = RecordedTransport(recorded, live if live_fallthrough else None)
    elif live is not None:
        transport = live
    else:
        raise BackboneUnavailable("the agent backbone needs the agent (--agent module:callable) or a recorded run")
    # One attempt: a user's agent is not a flaky endpoint to retry; what it raises stops the run.
    gateway = LLMGateway(transport, model, params={}, retry=RetryPolicy(max_attempts=1))
    return AgentBackbone(gateway, AGENT_NOTE.format(name=model),
                         live=live is not None and (recorded is None or live_fallthrough))
