"""The official MedAgentBench text protocol, read from its harness (`src/server/tasks/medagentbench/
__init__.py`, MIT, Stanford ML Group): how a reply becomes an action.

Each reply is stripped, code fences (```` ```tool_code ```` and ```` ``` ````) removed, stripped
again, and then judged by how it *starts*:
- `GET`: the rest of the reply, stripped, is the URL; the harness appends `&_format=json` (always
  `&`, even to a URL without `?`) and GETs it;
- `POST`: the rest of the first line is the URL; every following line together must be JSON
  (`json.loads`: any JSON value) or the answer is "Invalid POST request". The harness never sends
  the POST: an accepted one is only recorded in the conversation, where grading finds it;
- `FINISH(`: the result is `reply[len('FINISH('):-1]`: everything up to the last character, so text
  after the closing parenthesis breaks it;
- anything else (prose first, an empty reply) ends the episode as an invalid action.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

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

OFFICIAL_MAX_ROUNDS = 8
"""`max_round` of the official task config (configs/tasks/medagentbench.yaml)."""


@dataclass(frozen=True)
class Action:
    kind: Literal["get", "post", "finish", "invalid"]
    url: str = ""
    payload: object = None
    payload_error: str | None = None
    """POST: why the payload is not JSON (the harness answers "Invalid POST request")."""
    result: str | None = None
    """FINISH: `reply[len('FINISH('):-1]` of the cleaned reply, e.g. '["S6534835"]'."""


def clean_reply(reply: str) -> str:
    return reply.strip().replace("```tool_code", "").replace("```", "").strip()


def parse_action(reply: str) -> Action:
    r = clean_reply(reply)
    if r.startswith("GET"):
        return Action("get", url=r[3:].strip())
    if r.startswith("POST"):
        url = r.split("\n")[0][4:].strip()
        try:
            return Action("post", url=url, payload=json.loads("\n".join(r.split("\n")[1:])))
        except (json.JSONDecodeError, RecursionError) as exc:
            return Action("post", url=url, payload_error=getattr(exc, "msg", type(exc).__name__))
    if r.startswith("FINISH("):
        return Action("finish", result=r[len("FINISH("):-1])
    return Action("invalid")


def get_request_url(url: str) -> str:
    """What the harness GETs for `GET <url>`."""
    return url + "&_format=json"



_TOOL_FINISH = re.compile(r"FINISH\((.*)\)\s*$", re.DOTALL)


def finish_payload(text: str) -> str:
    """The tool-call protocol's answer (`<response>FINISH([...])</response>`: our own protocol, not the
    official one): the text inside a final FINISH(...), or the whole response."""
    m = _TOOL_FINISH.search(text.strip())
    return (m.group(1) if m else text).strip()
