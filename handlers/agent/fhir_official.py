"""The official MedAgentBench agent protocol, over the gateway: `GET url?params`, `POST url` + a JSON
payload, or `FINISH([answers])`, one per turn (MedAgentBench `src/server/tasks/medagentbench/__init__.py`).

Kept as the benchmark defines it, so scores are comparable with published ones: the whole task is one
user message (prompt with the function specs, context and question), every reply is an action, and
the harness answers with the official observation texts (`FhirTools.get_url` / `post_url`). As in the
official loop, code fences are stripped and the reply is cut to its first line that starts an action;
a reply with no action ends the task as an invalid action, and `max_rounds` replies without FINISH
end it at the limit. Both leave no answer, so the task grades incorrect (refsol needs the FINISH list).
The SkeMex-protocol loop over the same tools is `fhir_react.run_fhir_agent`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal

from grandrounds.handlers.cases import FhirCaseView
from grandrounds.handlers.environments.medagentbench import FhirTools
from grandrounds.handlers.llm.errors import LLMUnavailable
from grandrounds.handlers.llm.gateway import LLMGateway
from grandrounds.handlers.llm.recorder import Recorder

OFFICIAL_PROMPT = """You are an expert in using FHIR functions to assist medical professionals. You are given a question and a set of possible functions. Based on the question, you will need to make one or more function/tool calls to achieve the purpose.

1. If you decide to invoke a GET function, you MUST put it in the format of
GET url?param_name1=param_value1&param_name2=param_value2...

2. If you decide to invoke a POST function, you MUST put it in the format of
POST url
[your payload data in JSON format]

3. If you have got answers for all the questions and finished all the requested tasks, you MUST call to finish the conversation in the format of (make sure the list is JSON loadable.)
FINISH([answer1, answer2, ...])

Your response must be in the format of one of the three cases, and you can call only one function each time. You SHOULD NOT include any other text in the response.

Here is a list of functions in JSON format that you can invoke. Note that you should use {api_base} as the api_base.
{functions}

Context: {context}
Question: {question}"""
"""Verbatim from the official harness (MedAgentBench_prompt)."""

_ACTION_START = re.compile(r"^(GET |POST |FINISH\()", re.MULTILINE)


@dataclass(frozen=True)
class Action:
    kind: Literal["get", "post", "finish", "invalid"]
    url: str = ""
    payload: object = None
    payload_error: str | None = None
    result: str | None = None
    """FINISH: the text between the balanced parentheses, e.g. '["S6534835"]'."""


def parse_action(reply: str) -> Action:
    r = reply.strip().replace("```tool_code", "").replace("```", "").strip()
    m = _ACTION_START.search(r)
    if m:
        r = r[m.start():]
    if r.startswith("GET"):
        return Action("get", url=r[3:].strip().splitlines()[0] if r[3:].strip() else "")
    if r.startswith("POST"):
        head, _, body = r.partition("\n")
        try:
            return Action("post", url=head[4:].strip(), payload=json.loads(body))
        except json.JSONDecodeError as exc:
            return Action("post", url=head[4:].strip(), payload_error=exc.msg)
    if r.startswith("FINISH("):
        depth, start, end = 0, len("FINISH("), None
        for i, ch in enumerate(r[start - 1:], start - 1):  # the official balanced-parenthesis scan
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    end = i
                    break
        return Action("finish", result=r[start:end] if end is not None else r[start:])
    return Action("invalid")


@dataclass
class OfficialRun:
    status: Literal["completed", "invalid_action", "limit_reached", "failed"]
    result: str | None = None
    rounds: int = 0
    actions: list[Action] = field(default_factory=list)
    error: str | None = None


async def run_official_fhir_agent(gateway: LLMGateway, view: FhirCaseView, tools: FhirTools, recorder: Recorder,
                                  functions_json: str, max_rounds: int = 8, memory_prefix: str = "") -> OfficialRun:
    """`functions_json`: the function specs as the harness shows them (json.dumps of funcs_v1.json).
    `memory_prefix` (optional) goes before the prompt, so a memory policy can speak to the agent."""
    prompt = OFFICIAL_PROMPT.format(api_base=tools.public_base, functions=functions_json, context=view.context,
                                    question=view.instruction)
    if memory_prefix:
        prompt = f"## Memory from earlier tasks\n{memory_prefix}\n\n{prompt}"
    messages = [{"role": "user", "content": prompt}]
    run = OfficialRun("limit_reached")
    for rnd in range(1, max_rounds + 1):
        try:
            reply = await gateway.complete(messages, recorder, f"fhir-round-{rnd}")
        except LLMUnavailable as exc:
            run.status, run.error, run.rounds = "failed", f"model unavailable at round {rnd}: {exc}", rnd - 1
            return run
        run.rounds = rnd
        action = parse_action(reply.text)
        run.actions.append(action)
        messages.append({"role": "assistant", "content": reply.text})
        if action.kind == "finish":
            tools.finish(action.result)
            run.status, run.result = "completed", action.result
            return run
        if action.kind == "invalid":
            run.status = "invalid_action"
            return run
        if action.kind == "get":
            observation = tools.get_url(action.url)
        else:  # an unparsable payload is still a POST attempt (refsol's check_has_post counts it)
            observation = tools.post_url(action.url, action.payload if action.payload_error is None else None)
        messages.append({"role": "user", "content": observation})
    return run
