"""A deterministic OpenAI-compatible chat server on 127.0.0.1 for gateway and agent tests.

It plays the agent by the ReAct protocol (follow a memory rule naming an option, else call
the first tool once, else adopt a tool's letter, else pick by lexical overlap) and the
reflector by returning JSON; as the RetroSum summariser it lists every observation of the
history it was sent. `script` injects failures: entries (kind, action) with kind `act`,
`reflect`, `summarise` or `any`, consumed by the first matching request.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_OPTION = re.compile(r"^([A-Z])\) (.+)$", re.MULTILINE)
_WORD = re.compile(r"[a-z]{4,}")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


class FakeOpenAI:
    def __init__(self, schema_supported: bool = True):
        self.schema_supported = schema_supported
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

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                status, payload, headers = fake.answer(self.path, body, self.headers.get("authorization", ""))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

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
        if action == "429":
            return 429, {"error": {"message": "rate limited", "type": "rate_limit"}}, {"retry-after": "0"}
        if action == "500":
            return 500, {"error": {"message": "boom", "type": "server_error"}}, {}
        if action == "401":
            return 401, {"error": {"message": "bad key", "type": "auth"}}, {}
        rf = body.get("response_format")
        if rf and rf.get("type") == "json_schema" and not self.schema_supported:
            return 400, {"error": {"message": "response_format json_schema is not supported", "type": "invalid"}}, {}
        text = self._text(kind, body["messages"], action)
        prompt_chars = sum(len(m["content"]) for m in body["messages"])
        usage = {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(text) // 4,
                 "total_tokens": prompt_chars // 4 + len(text) // 4}
        return 200, {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": body["model"],
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": "stop"}], "usage": usage}, {}

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
