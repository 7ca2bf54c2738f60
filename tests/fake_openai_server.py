"""A deterministic OpenAI-compatible chat server on 127.0.0.1 for gateway and agent tests.

It plays the agent by the ReAct protocol (follow a memory rule naming an option, else call
the first tool once, else adopt a tool's letter, else pick by lexical overlap) and the
reflector by returning JSON; as the RetroSum summariser it lists every observation of the
history it was sent. `script` injects failures: entries (kind, action) with kind `act`,
`reflect`, `summarise` or `any`, consumed by the first matching request.

Transport faults (`FAULTS`, the fault matrix of tests/test_model_outages.py) are script actions too:
the server misbehaves at the HTTP level for that one request (a status with an HTML body, a 200 that
is not JSON or not a completion, a truncated or oversized body, a dropped connection, a hang past the
client's timeout). `/v1/models` answers 404 unless `models` is set (a server without a model list:
preflight then sends a one-token chat, answered here without touching `script` or `requests`).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("500", "503_html", "429", "html_200", "not_json", "error_200", "no_choices", "truncated", "drop", "hang",
          "oversized")
"""HTTP-level faults a script entry can inject (each retried by the gateway as a transport failure)."""
HANG_S = 3.0
"""How long `hang` stalls: longer than the 1 s client timeout the fault tests use."""

_OPTION = re.compile(r"^([A-Z])\) (.+)$", re.MULTILINE)
_WORD = re.compile(r"[a-z]{4,}")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


class Fault:
    def __init__(self, name: str):
        self.name = name


class FakeOpenAI:
    def __init__(self, schema_supported: bool = True, models: list[str] | str | None = None,
                 delay_s: float = 0.0, jitter_s: float = 0.0):
        self.schema_supported = schema_supported
        self.models = models
        self.delay_s = delay_s
        """Each chat request sleeps this long before it is answered (a slow model; requests are served
        in parallel, one thread each, like a server with several slots)."""
        self.jitter_s = jitter_s
        """Plus a random 0..jitter_s (OS-seeded): concurrent replies come back in shuffled order."""
        self._jitter = random.Random()
        self.in_flight = 0
        self.max_in_flight = 0
        """The most chat requests this server was answering at once."""
        self.pings = 0
        """Preflight one-token chats answered (not in `requests`)."""
        self.script: list[tuple[str, str]] = []
        self.requests: list[dict] = []
        self.auth_headers: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> "FakeOpenAI":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # one response, no 40 ms delayed-ACK stall

            def log_message(self, *args):  # quiet
                pass

            def _send(self, status, data: bytes, ctype="application/json", headers=None, length=None):
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data) if length is None else length))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models") and fake.models == "html":
                    self._send(200, b"<html><body>Sign in</body></html>", "text/html")
                elif self.path.rstrip("/").endswith("/models") and fake.models is not None:
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": m, "object": "model"} for m in fake.models]}).encode())
                else:
                    self._send(404, b'{"error": {"message": "not found"}}')

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                if body.get("max_tokens") == 1 and len(body.get("messages", ())) == 1:  # preflight ping
                    with fake._lock:
                        fake.pings += 1
                    data = json.dumps(fake.completion(body, "ok")).encode()
                    return self._send(200, data)
                with fake._lock:
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                    pause = fake.delay_s + (fake._jitter.uniform(0, fake.jitter_s) if fake.jitter_s else 0.0)
                try:
                    if pause:
                        time.sleep(pause)
                    status, payload, headers = fake.answer(self.path, body, self.headers.get("authorization", ""))
                finally:
                    with fake._lock:
                        fake.in_flight -= 1
                if isinstance(payload, Fault):
                    return self._fault(payload.name)
                self._send(status, json.dumps(payload).encode(), headers=headers)

            def _fault(self, name: str):
                if name == "503_html":
                    return self._send(503, b"<html><body><h1>503 Service Unavailable</h1></body></html>", "text/html")
                if name == "html_200":
                    return self._send(200, b"<!DOCTYPE html><html><body>Welcome to nginx!</body></html>", "text/html")
                if name == "not_json":
                    return self._send(200, b'{"id": "x", "choices": [{"message": {"content": "B"')
                if name == "error_200":
                    return self._send(200, b'{"error": {"message": "model overloaded", "code": 503}}')
                if name == "no_choices":
                    return self._send(200, b'{"id": "x", "object": "chat.completion", "choices": []}')
                if name == "truncated":  # announces more than it sends, then closes
                    self.close_connection = True
                    return self._send(200, b'{"id": "x", "choices": [{"mess', length=4096)
                if name == "oversized":
                    junk = b" " * (5 * 1024 * 1024)
                    return self._send(200, b'{"choices": [{"message": {"content": "A"}}], "pad": "' + junk + b'"}')
                if name == "drop":  # no status line at all
                    self.close_connection = True
                    return
                if name == "hang":
                    time.sleep(HANG_S)
                    self.close_connection = True
                    return
                raise ValueError(name)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # --- behaviour -------------------------------------------------------------------

    def answer(self, path: str, body: dict, auth: str):
        with self._lock:
            self.requests.append(body)
            self.auth_headers.append(auth)
            system = body["messages"][0]["content"]
            kind = ("reflect" if system.startswith("You maintain") else
                    "summarise" if system.startswith("You are the retrospective summariser") else "act")
            action = None
            for i, (k, a) in enumerate(self.script):
                if k in (kind, "any"):
                    action = a
                    del self.script[i]
                    break
        if action in FAULTS and action not in ("429", "500"):
            return 0, Fault(action), {}
        if action == "429":
            return 429, {"error": {"message": "rate limited", "type": "rate_limit"}}, {"retry-after": "0.01"}
        if action == "500":
            return 500, {"error": {"message": "boom", "type": "server_error"}}, {}
        if action == "400":
            return 400, {"error": {"message": "request exceeds the context window", "type": "invalid_request"}}, {}
        if action == "401":
            return 401, {"error": {"message": "bad key", "type": "auth"}}, {}
        rf = body.get("response_format")
        if rf and rf.get("type") == "json_schema" and not self.schema_supported:
            return 400, {"error": {"message": "response_format json_schema is not supported", "type": "invalid"}}, {}
        schema_name = (rf or {}).get("json_schema", {}).get("name")
        if action and action.startswith("raw:"):  # a scripted reply, verbatim (e.g. off-schema JSON)
            text = action[len("raw:"):]
        elif schema_name == "Probe":  # the json_schema probe: an enforcing server returns the schema's only value
            word = rf["json_schema"]["schema"]["properties"]["word"]["enum"][0]
            text = json.dumps({"word": word}) if self.schema_supported else "Hello!"
        elif schema_name == "AgentTurn" and action not in ("garbage",):  # schema-decoded agent turn
            text = self._as_schema_turn(self._text(kind, body["messages"], action))
        elif schema_name == "DoctorTurn" and action != "garbage":  # an AgentClinic doctor turn, schema-decoded
            text = self._as_doctor_turn(self._text(kind, body["messages"], action))
        elif schema_name == "FhirTurn" and action != "garbage":  # a react FHIR turn, schema-decoded
            text = self._as_fhir_turn(self._text(kind, body["messages"], action))
        else:
            text = self._text(kind, body["messages"], action)
        return 200, self.completion(body, text), {}

    @staticmethod
    def _as_doctor_turn(said: str) -> str:
        """A text doctor utterance as the JSON move an enforcing server would return (AgentClinic's order);
        a reply already written as JSON (a test's scripted move, on- or off-schema) is returned as is."""
        if said.lstrip().startswith("{"):
            return said
        d = re.search(r"DIAGNOSIS READY\s*:\s*(.*)", said)
        t = re.search(r"REQUEST TEST\s*:\s*(.*)", said)
        action = {"diagnosis": d.group(1)} if d else {"test": t.group(1)} if t else {"question": said}
        return json.dumps({"reasoning": "Working through the presentation.", "action": action})

    @staticmethod
    def _as_fhir_turn(text: str) -> str:
        """A tag FHIR turn as the JSON an enforcing server would return for the turn's schema (JSON as is)."""
        if text.lstrip().startswith("{"):
            return text
        reasoning = re.search(r"<reasoning>(.*?)</reasoning>", text, re.DOTALL)
        response = re.search(r"<response>\s*FINISH\((.*)\)\s*</response>", text, re.DOTALL)
        tool = re.search(r"<tool>(.*?)</tool>", text, re.DOTALL)
        if response:
            action = {"finish": json.loads(response.group(1))}
        else:
            call = json.loads(tool.group(1)) if tool else {"name": "?"}
            action = {"tool": call["name"], "arguments": call.get("arguments", {})}
        return json.dumps({"reasoning": reasoning.group(1) if reasoning else "", "action": action})

    @staticmethod
    def completion(body: dict, text: str) -> dict:
        prompt_chars = sum(len(m["content"]) for m in body["messages"])
        usage = {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(text) // 4,
                 "total_tokens": prompt_chars // 4 + len(text) // 4}
        return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}], "usage": usage}

    def _text(self, kind: str, messages: list[dict], action: str | None) -> str:
        if kind == "reflect":
            return self._reflection(messages, action)
        if kind == "summarise":
            return self._summary(messages)
        if action == "bad_json_tool":
            return '<reasoning>I should look it up.</reasoning>\n<tool>{"name": oops</tool>'
        if action == "no_action":
            return "<reasoning>Still thinking about the differential.</reasoning>"
        if action == "unknown_tool":
            return '<reasoning>Let me check.</reasoning>\n<tool>{"name": "xray-reader", "arguments": {}}</tool>'
        if action == "garbage":
            return "I am not sure about this one."
        return self._act(messages)

    def _act(self, messages: list[dict]) -> str:
        task = messages[1]["content"]
        options = dict(_OPTION.findall(task.split("Options:", 1)[-1]))
        for text in re.findall(r"favour '([^']+)'", task):
            for k, v in options.items():
                if v == text:
                    return f"<reasoning>A memory rule names option {k}.</reasoning>\n<response>{k}</response>"
        observations = [m["content"] for m in messages[2:] if m["role"] == "user"]
        for obs in observations:
            m = re.match(r"Observation: (\S+) -> ([A-Z])\b", obs)
            if m and m.group(2) in options:
                return f"<reasoning>{m.group(1)} supports {m.group(2)}.</reasoning>\n<response>{m.group(2)}</response>"
        tools = re.search(r"Available tools: (.+)", messages[0]["content"]).group(1)
        final = "[Final step" in messages[-1]["content"]
        called = any(re.match(r"Observation: \S+ -> ", o) for o in observations)
        if not tools.startswith("none") and not called and not final:
            name = tools.split(" (", 1)[0]
            return f'<reasoning>Consult {name}.</reasoning>\n<tool>{{"name": "{name}", "arguments": {{}}}}</tool>'
        q = _words(task.split("## Case", 1)[-1].split("Options:", 1)[0])
        best = sorted(options, key=lambda k: (-len(_words(options[k]) & q), k))[0]
        return f"<reasoning>Option {best} overlaps the presentation most.</reasoning>\n<response>{best}</response>"

    @staticmethod
    def _as_schema_turn(text: str) -> str:
        """The tag reply as the JSON an enforcing server would return for the turn's schema."""
        reasoning = re.search(r"<reasoning>(.*?)</reasoning>", text, re.DOTALL)
        response = re.search(r"<response>(.*?)</response>", text)
        tool = re.search(r'"name": "([^"]+)"', text)
        action = {"answer": response.group(1)} if response else {"tool": tool.group(1) if tool else "?"}
        return json.dumps({"reasoning": reasoning.group(1) if reasoning else "", "action": action})

    def _summary(self, messages: list[dict]) -> str:
        observations = re.findall(r"^Observation: (.*)$", messages[1]["content"], re.MULTILINE)
        lines = [f"- step {i}: {o[:80]}" for i, o in enumerate(observations, start=1)]
        return f"Retrospective summary of {len(observations)} steps:\n" + "\n".join(lines)

    def _reflection(self, messages: list[dict], action: str | None) -> str:
        if action == "bad_reflection":
            return "Sure! Here are my thoughts: the agent did fine."
        prompt = messages[1]["content"]
        gold = re.search(r"correct answer: ([A-Z])\) (.+?) \((correct|wrong)\)", prompt)
        question = prompt.split("\n", 2)[1]
        terms = sorted(_words(question))[:6]
        data = {"summary": f"Correct answer was {gold.group(1)}; the agent was {gold.group(3)}.",
                "guideline": f"When a case presents with {', '.join(terms)}, consider '{gold.group(2)}'.",
                "edits": [{"op": "add", "text": f"If the presentation includes {', '.join(terms)}: favour '{gold.group(2)}'.",
                           "trigger": terms, "priority": 1, "reason": "from feedback"}]}
        return json.dumps(data)
