"""The benchmark's FHIR functions as the harness executes them, recording the trajectory.

GET and POST are written once (`get_url`, `post_url`: the official harness's semantics); the
tool-call protocol's `call(name, arguments)` only builds the URL and goes through them.
- GET: the URL plus `&_format=json`, sent as the official client sends it (`client.request_url`);
  the answer is the official observation text with the body, or the official error text.
  Only URLs under the base the agent was shown are fetched: a model's output must not make the
  harness read anything else (officially any URL is fetched; elsewhere it would fail anyway).
- POST: never sent, as officially: accepted when the payload is JSON (any JSON value), and the
  acceptance is what grading reads.
Every call is recorded at the public base (what the agent sees and the log keeps); requests go to
`base` (the sandbox's free port, or the real server).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from grandrounds.handlers.environments.medagentbench.client import FhirClient, FhirTransportError, request_url
from grandrounds.handlers.environments.medagentbench.protocol import get_request_url
from grandrounds.handlers.environments.medagentbench.tasks import FhirFunction
from grandrounds.handlers.environments.medagentbench.trajectory import (GET_ERROR, GET_OK, POST_INVALID, POST_OK,
                                                                       FhirCall, FhirTrajectory)


class FhirTools:
    def __init__(self, functions: list[FhirFunction], base: str, public_base: str | None = None,
                 client: FhirClient | None = None, protocol: str = "react", functions_json: str = "[]",
                 max_rounds: int = 8):
        self.functions = {f.name: f for f in functions}
        self.protocol = protocol
        """How a model agent acts on these tools (the environment's record): `official` or `react`."""
        self.functions_json = functions_json
        """The function specs as the official prompt shows them (json.dumps of funcs_v1.json)."""
        self.max_rounds = max_rounds
        self.base = base if base.endswith("/") else base + "/"
        self.public_base = (public_base or self.base).rstrip("/") + "/"
        """The base the agent is shown and writes URLs with. The sandbox listens on a free port;
        showing the agent a fixed base instead keeps its prompts (and so the request hashes a recorded
        run is re-served by) the same from one run to the next."""
        self.client = client or FhirClient()
        self.trajectory = FhirTrajectory()

    @property
    def names(self) -> list[str]:
        return list(self.functions)

    def _under_base(self, url: str) -> bool:
        return url.startswith(self.public_base) and ".." not in url[len(self.public_base):]

    def public(self, text: str) -> str:
        return text.replace(self.base, self.public_base) if self.base != self.public_base else text

    async def get_url(self, url: str) -> str:
        """The harness's `GET <url>`: observation text; the call is recorded (URL as sent, public base)."""
        full = get_request_url(url)
        if not self._under_base(url):
            self.trajectory.calls.append(FhirCall("GET", full, accepted=False))
            return GET_ERROR.format(error=f"only URLs under {self.public_base} are served")
        real = self.base + full[len(self.public_base):]
        try:
            r = await self.client.get(real)
        except FhirTransportError as exc:
            self.trajectory.calls.append(FhirCall("GET", full, accepted=False))
            return GET_ERROR.format(error=self.public(str(exc)))
        self.trajectory.calls.append(FhirCall("GET", full, accepted=r.ok))
        if not r.ok:
            return GET_ERROR.format(error=r.official_error(self.public(request_url(real))))
        # utils.send_get_request: the parsed body only for exactly `application/json`, else the text
        data = str(json.loads(r.text)) if r.content_type == "application/json" else r.text
        return GET_OK.format(data=self.public(data))

    def post_url(self, url: str, payload: Any, payload_error: str | None = None) -> str:
        """The harness's `POST <url>` + payload: accepted when the payload parsed as JSON; nothing is sent."""
        accepted = payload_error is None
        self.trajectory.calls.append(FhirCall("POST", url, payload if accepted else None, accepted=accepted))
        return POST_OK if accepted else POST_INVALID

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """One function of the tool-call protocol: GET with the arguments as query parameters, POST with
        them as the payload."""
        fn = self.functions.get(name)
        if fn is None:
            raise KeyError(f"unknown FHIR tool {name!r}")
        url = self.public_base + fn.resource
        if fn.method == "GET":
            return await self.get_url(f"{url}?{urlencode({k: str(v) for k, v in arguments.items()})}")
        return self.post_url(url, arguments)

    def finish(self, result: str | None) -> None:
        self.trajectory.result = result
