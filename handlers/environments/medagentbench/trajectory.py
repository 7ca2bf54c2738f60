"""What one MedAgentBench episode leaves for grading: the executed calls, the FINISH text and the
conversation as the official harness keeps it (`session.history`: role `user` or `agent`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

GET_OK = ("Here is the response from the GET request:\n{data}. Please call FINISH if you have got answers for all "
          "the questions and finished all the requested tasks")
GET_ERROR = "Error in sending the GET request: {error}"
POST_OK = ("POST request accepted and executed successfully. Please call FINISH if you have got answers for all "
           "the questions and finished all the requested tasks")
POST_INVALID = "Invalid POST request"
"""The official harness's observation texts (`__init__.py`), verbatim."""


@dataclass(frozen=True)
class FhirCall:
    method: str
    url: str
    payload: object = None
    accepted: bool = True
    """POST: the harness's "POST request accepted" (its payload parsed as JSON); GET: HTTP 200."""

    def record(self, name: str | None = None, url: str | None = None) -> str:
        """The call as a recorded `tool` step: canonical JSON (`url`: the URL as recorded, default the
        call's own; `name`: the function, for the tool-call protocol)."""
        data: dict = {"method": self.method, "url": self.url if url is None else url, "accepted": self.accepted}
        if name:
            data["name"] = name
        if self.method == "POST":
            data["payload"] = self.payload
        return json.dumps(data, sort_keys=True)


@dataclass(frozen=True)
class Message:
    role: Literal["user", "agent"]
    content: str


@dataclass
class FhirTrajectory:
    calls: list[FhirCall] = field(default_factory=list)
    result: str | None = None
    """The text the official harness takes from `FINISH(...)`, e.g. '["S6534835"]'; None when the
    episode ended without one (invalid action, turn limit): officially such a task is not graded."""
    history: list[Message] | None = None
    """The raw agent replies and the harness's answers, when the agent spoke the official text
    protocol. None for the tool-call protocol: `official_history` then writes each call as the
    official reply that makes it, so both are graded by the same refsol reading."""

    def official_history(self) -> list[Message]:
        if self.history is not None:
            return self.history
        out: list[Message] = []
        for c in self.calls:
            if c.method == "GET":
                out += [Message("agent", f"GET {c.url}"), Message("user", GET_OK if c.accepted else GET_ERROR)]
            else:
                body = json.dumps(c.payload) if c.payload is not None else ""
                out += [Message("agent", f"POST {c.url}\n{body}"),
                        Message("user", POST_OK if c.accepted else POST_INVALID)]
        if self.result is not None:
            out.append(Message("agent", f"FINISH({self.result})"))
        return out
