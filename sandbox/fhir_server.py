"""A tiny local FHIR server for MedAgentBench: the recorded patient snapshot served on 127.0.0.1.

A test and benchmark stand-in for the official HAPI FHIR JPA server (docker image
jyxsu6/medagentbench), not part of a run's logic. The snapshot
(`medagentbench_rl_fork/patients_from_snapshot.json`, 500 Patient resources recorded from that
server) covers every MRN of the official 300 tasks, which is enough for task types 1, 2, 3 and 8:

- `GET {base}Patient?...` searched as HAPI searches (`fhir_search`: string prefix per name part,
  case- and accent-insensitive; year/month/day date ranges with prefixes; repeated parameters AND,
  commas OR; unknown parameters 400), and `GET {base}Patient/<id>`;
- `GET` of Observation, Condition, MedicationRequest, Procedure, ServiceRequest: an empty searchset,
  which is what the recorded snapshot holds for every Observation query. Tasks that read lab data
  (4-7, 9, 10) are therefore NOT meaningful here (point at the real server, `--fhir-base`);
- search results in HAPI's bundle shape: `resourceType, id, meta, type, total, link[, entry]`, no
  `entry` when nothing matched, the self link with the parameters sorted (as recorded from HAPI);
- `POST {base}<known resource type>` with a JSON object: 201, recorded in `posts`, nothing stored;
  an unknown resource type is 404, as HAPI answers. (The MedAgentBench harness never sends its
  POSTs: it only accepts them. The endpoint exists for clients that do.)

Answers are deterministic: bundle ids are derived from the request and `meta.lastUpdated` is the
benchmark's fixed "now", so a trajectory holding them is the same bytes on a re-execution.
`FhirSandbox(patients).start()` binds a free port; `.base` is `http://127.0.0.1:<port>/fhir/`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

from grandrounds.sandbox.fhir_search import NON_FILTERING, SearchError, search
from grandrounds.store.canonical import content_hash

SEARCHABLE = ("Observation", "Condition", "MedicationRequest", "Procedure", "ServiceRequest")
RESOURCE_TYPES = ("Patient",) + SEARCHABLE
LAST_UPDATED = "2023-11-13T10:15:00.000+00:00"
"""`meta.lastUpdated` of every bundle: the benchmark's "now", not the wall clock (determinism)."""


def load_patients(path: str | Path) -> list[dict]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(isinstance(p, dict) and p.get("resourceType") == "Patient" for p in data):
        raise ValueError(f"{path}: expected a JSON list of FHIR Patient resources")
    return data


def self_link(base: str, resource: str, params: list[tuple[str, str]]) -> str:
    """HAPI's self link: the filtering parameters and `_count`, sorted by name (as recorded)."""
    kept = sorted((k, v) for k, v in params if k not in NON_FILTERING or k == "_count")
    return f"{base}{resource}" + (f"?{urlencode(kept)}" if kept else "")


def bundle(base: str, url: str, resources: list[dict]) -> dict:
    # Ids derived from the request, not uuid4: responses reach the agent's trajectory, whose
    # events must be the same bytes on a re-execution (DESIGN §3). Hashed without the base, whose
    # port is free-chosen per run, so the id is also the same from one sandbox to the next.
    key = url[len(base):] if url.startswith(base) else url
    out = {"resourceType": "Bundle", "id": content_hash(key)[:32], "meta": {"lastUpdated": LAST_UPDATED},
           "type": "searchset", "total": len(resources), "link": [{"relation": "self", "url": url}]}
    if resources:  # HAPI leaves `entry` out of an empty searchset
        out["entry"] = [{"fullUrl": f"{base}{r['resourceType']}/{r['id']}", "resource": r,
                         "search": {"mode": "match"}} for r in resources]
    return out


def outcome(message: str) -> dict:
    return {"resourceType": "OperationOutcome",
            "issue": [{"severity": "error", "code": "processing", "diagnostics": message}]}


class FhirSandbox:
    """The snapshot behind a threaded HTTP server on 127.0.0.1; `posts` records accepted POSTs."""

    def __init__(self, patients: list[dict], prefix: str = "/fhir/", base: str | None = None):
        """`base`: the address answers name (fullUrl, self links) when it is not this server's own,
        e.g. to compare with responses recorded from another server."""
        self.patients = patients
        self._fixed_base = base
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
        if self._fixed_base is not None:
            return self._fixed_base
        if self._server is None:
            raise RuntimeError("sandbox not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}{self.prefix}"

    def search_patients(self, params: dict[str, str] | list[tuple[str, str]]) -> list[dict]:
        """HAPI's Patient search (`fhir_search`); a dict is one value per parameter."""
        return search(self.patients, list(params.items()) if isinstance(params, dict) else params)

    # -- HTTP -------------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, body: bytes | None) -> tuple[int, dict]:
        self.requests.append((method, raw_path))
        parts = urlsplit(raw_path)
        if not parts.path.startswith(self.prefix):
            return 404, outcome(f"unknown path {parts.path}")
        rest = parts.path[len(self.prefix):].strip("/").split("/")
        resource = rest[0]
        if resource not in RESOURCE_TYPES:
            return 404, outcome(f"Unknown resource type '{resource}' - Server knows how to handle: "
                                f"{sorted(RESOURCE_TYPES)}")
        if method == "POST":
            if len(rest) != 1:
                return 400, outcome(f"POST to {parts.path} is not a create")
            try:
                payload = json.loads(body or b"")
            except (json.JSONDecodeError, UnicodeDecodeError):
                return 400, outcome("Failed to parse request body as JSON resource")
            if not isinstance(payload, dict):
                return 400, outcome("Failed to parse request body as JSON resource")
            self.posts.append((resource, payload))
            return 201, {**payload, "id": f"{resource.lower()}-{len(self.posts)}"}
        params = parse_qsl(parts.query, keep_blank_values=True)
        if len(rest) == 2:
            if resource == "Patient" and rest[1] in self.by_id:
                return 200, self.by_id[rest[1]]
            return 404, outcome(f"Resource {resource}/{rest[1]} is not known")
        if len(rest) != 1:
            return 400, outcome(f"unsupported path {parts.path}")
        url = self_link(self.base, resource, params)
        if resource == "Patient":
            try:
                return 200, bundle(self.base, url, search(self.patients, params))
            except SearchError as exc:
                return 400, outcome(str(exc))
        return 200, bundle(self.base, url, [])  # the snapshot holds no data for these

    def start(self) -> "FhirSandbox":
        sandbox = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, status: int, data: dict) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                # HAPI's content type: not exactly `application/json`, so the official client keeps
                # the body as text (utils.send_get_request) and refsol `json.loads` it.
                self.send_header("Content-Type", "application/fhir+json;charset=utf-8")
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
