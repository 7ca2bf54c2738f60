"""A tiny local FHIR sandbox for MedAgentBench: the recorded patient snapshot served on 127.0.0.1.

The snapshot (`medagentbench_rl_fork/patients_from_snapshot.json`, 500 Patient resources recorded
from the MedAgentBench docker image) covers every MRN of the official 300 tasks, which is enough to
answer what tasks 1, 2, 3 and 8 need:

- `GET {base}Patient?identifier=MRN`, `?name=&birthdate=`, `?family=&given=&birthdate=` (also
  `gender`), and `GET {base}Patient/<id>`, as FHIR searchset Bundles (HAPI-style string search:
  case-insensitive prefix match on any name part; `birthdate` is an exact day).
- `GET` of Observation, Condition, MedicationRequest, Procedure, ServiceRequest: an empty searchset
  Bundle (total 0), which is what the recorded snapshot holds for every Observation query. Tasks that
  depend on lab data (4-7, 9, 10) are therefore NOT meaningful here; point at the real server instead
  (`--fhir-base`).
- `POST {base}<Resource>` with a JSON object body: 201 and recorded in `posts`, nothing stored.
  Grading never reads the server for POSTs: it uses the trajectory, as the benchmark does.

`FhirSandbox(patients).start()` binds a free port; `.base` is `http://127.0.0.1:<port>/fhir/`.
"""

from __future__ import annotations

import json
import threading
import unicodedata
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from grandrounds.store.canonical import content_hash

SEARCHABLE = ("Observation", "Condition", "MedicationRequest", "Procedure", "ServiceRequest")
POSTABLE = ("Observation", "MedicationRequest", "ServiceRequest")
_IGNORED = {"_format", "_count", "_pretty"}


def load_patients(path: str | Path) -> list[dict]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(isinstance(p, dict) and p.get("resourceType") == "Patient" for p in data):
        raise ValueError(f"{path}: expected a JSON list of FHIR Patient resources")
    return data


def _fold(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c)).casefold().strip()


def _names(p: dict, part: str) -> list[str]:
    out: list[str] = []
    for n in p.get("name", []):
        if part in ("family", "name") and n.get("family"):
            out.append(n["family"])
        if part in ("given", "name"):
            out.extend(n.get("given", []))
        if part == "name" and n.get("text"):
            out.append(n["text"])
    return [_fold(x) for x in out]


def _matches(p: dict, params: dict[str, str]) -> bool:
    for key, value in params.items():
        v = _fold(value)
        if key == "identifier":
            ident = value.split("|")[-1]
            if ident != p.get("id") and ident not in [i.get("value") for i in p.get("identifier", [])]:
                return False
        elif key in ("name", "family", "given"):
            words = v.split()  # "Peter Stafford": every word must prefix some name part
            if not words or not all(any(n.startswith(w) for n in _names(p, key)) for w in words):
                return False
        elif key == "birthdate":
            if p.get("birthDate") != value.removeprefix("eq"):
                return False
        elif key in ("gender", "legal-sex"):
            if _fold(p.get("gender", "")) != v:
                return False
        elif key == "_id":
            if p.get("id") != value:
                return False
        else:
            raise KeyError(key)
    return True


def bundle(base: str, url: str, resources: list[dict]) -> dict:
    # Ids derived from the request, not uuid4: responses reach the agent's trajectory, whose
    # events must be the same bytes on a re-execution (DESIGN §3). Hashed without the base, whose
    # port is free-chosen per run, so the id is also the same from one sandbox to the next.
    key = url[len(base):] if url.startswith(base) else url
    return {"resourceType": "Bundle", "id": content_hash(key)[:32], "type": "searchset", "total": len(resources),
            "link": [{"relation": "self", "url": url}],
            "entry": [{"fullUrl": f"{base}{r['resourceType']}/{r['id']}", "resource": r,
                       "search": {"mode": "match"}} for r in resources]}


def outcome(message: str) -> dict:
    return {"resourceType": "OperationOutcome",
            "issue": [{"severity": "error", "code": "processing", "diagnostics": message}]}


class FhirSandbox:
    """The snapshot behind a threaded HTTP server on 127.0.0.1; `posts` records accepted POSTs."""

    def __init__(self, patients: list[dict], prefix: str = "/fhir/"):
        self.patients = patients
        self.by_id = {p["id"]: p for p in patients}
        self.prefix = prefix
        self.posts: list[tuple[str, dict]] = []
        self.requests: list[tuple[str, str]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_file(cls, path: str | Path) -> "FhirSandbox":
        return cls(load_patients(path))

    @property
    def base(self) -> str:
        if self._server is None:
            raise RuntimeError("sandbox not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}{self.prefix}"

    def search_patients(self, params: dict[str, str]) -> list[dict]:
        return [p for p in self.patients if _matches(p, params)]

    # -- HTTP -------------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, body: bytes | None) -> tuple[int, dict]:
        self.requests.append((method, raw_path))
        parts = urlsplit(raw_path)
        if not parts.path.startswith(self.prefix):
            return 404, outcome(f"unknown path {parts.path}")
        rest = parts.path[len(self.prefix):].strip("/").split("/")
        resource = rest[0]
        if method == "POST":
            if resource not in POSTABLE or len(rest) != 1:
                return 404, outcome(f"POST {resource} is not supported")
            try:
                payload = json.loads(body or b"")
            except (json.JSONDecodeError, UnicodeDecodeError):
                return 400, outcome("body is not valid JSON")
            if not isinstance(payload, dict):
                return 400, outcome("body must be a JSON object")
            self.posts.append((resource, payload))
            return 201, {**payload, "id": f"{resource.lower()}-{len(self.posts)}"}
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items() if k not in _IGNORED}
        url = self.base + "/".join(rest) + (f"?{parts.query}" if parts.query else "")
        if resource == "Patient":
            if len(rest) == 2:
                p = self.by_id.get(rest[1])
                return (200, p) if p else (404, outcome(f"Patient/{rest[1]} not found"))
            try:
                return 200, bundle(self.base, url, self.search_patients(query))
            except KeyError as exc:
                return 400, outcome(f"unknown Patient search parameter {exc.args[0]!r} in the sandbox")
        if resource in SEARCHABLE and len(rest) == 1:
            return 200, bundle(self.base, url, [])  # the snapshot holds no data for these
        return 404, outcome(f"{resource} is not served by the sandbox")

    def start(self) -> "FhirSandbox":
        sandbox = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, status: int, data: dict) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/fhir+json; charset=utf-8")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):  # noqa: N802
                self._reply(*sandbox.handle("GET", self.path, None))

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                self._reply(*sandbox.handle("POST", self.path, self.rfile.read(n)))

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fhir-sandbox", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self) -> "FhirSandbox":
        return self.start() if self._server is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
