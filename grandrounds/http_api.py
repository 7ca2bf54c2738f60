"""`grandrounds serve`: the Python API over HTTP (Starlette), for agents that are not written in Python.

The same operations as `grandrounds.api`, one namespace (run) per path:

    PUT  /v1/namespaces/{ns}                 open (create or resume) with a NamespaceConfig
    POST /v1/namespaces/{ns}/recall          CaseInput            -> Recall
    POST /v1/namespaces/{ns}/record          RecordRequest        -> Recorded
    POST /v1/namespaces/{ns}/feedback        FeedbackRequest      -> FeedbackResult
    POST /v1/namespaces/{ns}/cancel          CaseRef
    GET  /v1/namespaces/{ns}/history/{item}  GET .../explain/{case_id}  GET .../as_of?seq=S|case=N
    POST /v1/namespaces/{ns}/verify          POST .../replay (ReplayRequest)
    GET  /health (open)                      GET /openapi.json

Security: bound to 127.0.0.1 unless told otherwise; every route but `/health` needs
`Authorization: Bearer <token>`, the token from `GRANDROUNDS_API_TOKEN` or `--token-file`, compared in
constant time and never written to the events or the database. Without a configured token the server
refuses a non-loopback address, and on loopback makes a one-off token it prints on stderr. A refused
request (401, 422) is answered before any handler runs: nothing is written.

The server process is the DuckDB file's only writer (DuckDB allows one writing process per file);
concurrent requests take turns on one lock (`MemoryHub`), and a recall of another case while one is
open waits for it (up to `RECALL_WAIT_S`), since a namespace's cases are handled in order.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import os
import secrets
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from grandrounds.api import (CaseInput, CaseOpen, FeedbackResult, MemoryHub, NamespaceConfig, Recall, Recorded,
                             UnknownCase)
from grandrounds.errors import message_of, where_raised
from grandrounds.handlers.llm.errors import ReplayDivergence
from grandrounds.store.errors import InvalidInput
from grandrounds.store.event_types import AgentStep
from grandrounds.store.llm_events import TokenUsage

TOKEN_ENV = "GRANDROUNDS_API_TOKEN"
DEFAULT_PORT = 8765
RECALL_WAIT_S = 30.0
"""How long a recall waits for another open case of its namespace (another client's) before a 409."""
API_VERSION = "1"


class RecordRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    case_id: str = Field(min_length=1)
    answer: str = Field(min_length=1)
    steps: list[AgentStep] = Field(default_factory=list)
    used: list[str] = Field(default_factory=list)
    usage: TokenUsage | None = None


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    case_id: str = Field(min_length=1)
    outcome: str | None = None
    """The gold option letter (omit when the recalled case carried it)."""


class CaseRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    case_id: str = Field(min_length=1)


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    orders: int = Field(default=5, ge=1, le=100)
    seed: int = Field(default=0, ge=0)


class Opened(BaseModel):
    namespace: str
    cases_completed: int
    config: NamespaceConfig


class Problem(BaseModel):
    """Every error body: what went wrong, and for bad input the first field at fault."""

    error: str
    field: str | None = None
    detail: list[dict[str, Any]] | None = None


# --- configuration -------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def configured_token(token_file: str | None) -> str | None:
    """The bearer token: `--token-file` (its first line), else $GRANDROUNDS_API_TOKEN; None if neither."""
    if token_file:
        text = Path(token_file).read_text(encoding="utf-8").strip()
        if not text:
            raise InvalidInput(f"--token-file {token_file}: empty")
        return text.splitlines()[0].strip()
    return os.environ.get(TOKEN_ENV) or None


def server_token(host: str, token_file: str | None) -> tuple[str, bool]:
    """(token, generated): refuses a non-loopback host without a configured token."""
    token = configured_token(token_file)
    if token is not None:
        return token, False
    if not is_loopback(host):
        raise InvalidInput(f"refusing to serve on {host} without a token: set {TOKEN_ENV} or give --token-file")
    return secrets.token_urlsafe(32), True


# --- the application -----------------------------------------------------------------------


class BearerAuth:
    """ASGI middleware: 401 for any route but /health without the right bearer token (before the route)."""

    def __init__(self, app, token: str):
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                response = JSONResponse({"error": "missing or wrong bearer token"}, status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _field(err: dict) -> str:
    return ".".join(str(p) for p in err.get("loc", ())) or "(body)"


def _invalid(exc: ValidationError) -> JSONResponse:
    errors = [{"field": _field(e), "message": e["msg"], "type": e["type"]} for e in exc.errors()]
    first = errors[0]
    return JSONResponse({"error": f"field {first['field']!r}: {first['message']}", "field": first["field"],
                         "detail": errors}, status_code=422)


async def _body(request: Request, model: type[BaseModel]) -> BaseModel | JSONResponse:
    raw = await request.body()
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, RecursionError) as exc:
        return JSONResponse({"error": f"body is not JSON: {exc}", "field": "(body)"}, status_code=422)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        return _invalid(exc)


def _json(model: BaseModel | dict) -> JSONResponse:
    return JSONResponse(model.model_dump(mode="json") if isinstance(model, BaseModel) else model)


def _failure(exc: Exception) -> JSONResponse:
    if where_raised(exc) is not None:  # escaped a case while it ran: never the client's fault, whatever its class
        return JSONResponse({"error": message_of(exc), "kept": "nothing of this case was written; the "
                             "namespace's committed cases are kept, and the case is still open: send its feedback "
                             "again once the cause is fixed"}, status_code=500)
    if isinstance(exc, KeyError):
        return JSONResponse({"error": f"namespace {exc.args[0]!r} is not open: PUT /v1/namespaces/{exc.args[0]} "
                                      "first"}, status_code=404)
    if isinstance(exc, (CaseOpen, UnknownCase, ReplayDivergence)):
        return JSONResponse({"error": str(exc)}, status_code=409)
    if isinstance(exc, ValidationError):
        return _invalid(exc)
    if isinstance(exc, InvalidInput):
        return JSONResponse({"error": str(exc)}, status_code=400)
    raise exc


def build_app(hub: MemoryHub, token: str) -> Starlette:
    """The Starlette app over `hub` (tests drive it with a TestClient; `serve` with uvicorn)."""

    def guarded(handler):
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # mapped by what it is (`_failure`), else raised on
                return _failure(exc)
        endpoint.__name__ = handler.__name__
        endpoint.__doc__ = handler.__doc__
        return endpoint

    def ns(request: Request) -> str:
        return request.path_params["namespace"]

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "api": API_VERSION})

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document())

    async def open_namespace(request: Request) -> Response:
        body = await _body(request, NamespaceConfig)
        if isinstance(body, JSONResponse):
            return body
        memory = await hub.open(ns(request), body)
        completed = memory._session.ctx.projection.state.cases_completed
        return _json(Opened(namespace=memory.namespace, cases_completed=completed, config=body))

    async def recall(request: Request) -> Response:
        body = await _body(request, CaseInput)
        if isinstance(body, JSONResponse):
            return body
        return _json(await hub.get(ns(request)).recall(body, wait=RECALL_WAIT_S))

    async def record(request: Request) -> Response:
        body = await _body(request, RecordRequest)
        if isinstance(body, JSONResponse):
            return body
        return _json(await hub.get(ns(request)).record(body.case_id, body.answer, body.steps, body.used, body.usage))

    async def feedback(request: Request) -> Response:
        body = await _body(request, FeedbackRequest)
        if isinstance(body, JSONResponse):
            return body
        return _json(await hub.get(ns(request)).feedback(body.case_id, body.outcome))

    async def cancel(request: Request) -> Response:
        body = await _body(request, CaseRef)
        if isinstance(body, JSONResponse):
            return body
        await hub.get(ns(request)).cancel(body.case_id)
        return JSONResponse({"cancelled": body.case_id})

    async def history(request: Request) -> Response:
        return _json(await hub.get(ns(request)).history(request.path_params["item_id"]))

    async def explain(request: Request) -> Response:
        return _json(await hub.get(ns(request)).explain(request.path_params["case_id"]))

    async def as_of(request: Request) -> Response:
        try:
            query = AsOfQuery.model_validate(dict(request.query_params))
        except ValidationError as exc:
            return _invalid(exc)
        return _json(await hub.get(ns(request)).as_of(query.seq, query.case))

    async def verify(request: Request) -> Response:
        return _json(await hub.get(ns(request)).verify())

    async def replay(request: Request) -> Response:
        body = await _body(request, ReplayRequest)
        if isinstance(body, JSONResponse):
            return body
        return _json(await hub.get(ns(request)).replay(body.orders, body.seed))

    base = "/v1/namespaces/{namespace:str}"
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route(base, guarded(open_namespace), methods=["PUT"]),
        Route(f"{base}/recall", guarded(recall), methods=["POST"]),
        Route(f"{base}/record", guarded(record), methods=["POST"]),
        Route(f"{base}/feedback", guarded(feedback), methods=["POST"]),
        Route(f"{base}/cancel", guarded(cancel), methods=["POST"]),
        Route(base + "/history/{item_id:str}", guarded(history), methods=["GET"]),
        Route(base + "/explain/{case_id:str}", guarded(explain), methods=["GET"]),
        Route(f"{base}/as_of", guarded(as_of), methods=["GET"]),
        Route(f"{base}/verify", guarded(verify), methods=["POST"]),
        Route(f"{base}/replay", guarded(replay), methods=["POST"]),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            await hub.aclose()  # checkpoints, the cache's new vectors, the file closed

    return Starlette(routes=routes, middleware=[Middleware(BearerAuth, token=token)], lifespan=lifespan)


class AsOfQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq: int | None = Field(default=None, ge=0)
    case: int | None = Field(default=None, ge=0)


# --- OpenAPI ---------------------------------------------------------------------------------

_OPERATIONS: list[tuple[str, str, str, type[BaseModel] | None, type[BaseModel] | None, str]] = [
    ("get", "/health", "health", None, None, "Liveness (no token needed)."),
    ("put", "/v1/namespaces/{namespace}", "open", NamespaceConfig, Opened,
     "Open a namespace (a run): create it, or resume it with the same configuration."),
    ("post", "/v1/namespaces/{namespace}/recall", "recall", CaseInput, Recall,
     "Read memory for a case and open it: the items to show the agent, as `retrieve` records them."),
    ("post", "/v1/namespaces/{namespace}/record", "record", RecordRequest, Recorded,
     "What the agent did on the open case (recorded as its reply when the feedback arrives)."),
    ("post", "/v1/namespaces/{namespace}/feedback", "feedback", FeedbackRequest, FeedbackResult,
     "The open case's outcome (its gold option letter): grade, reflect, govern, commit; the memory changes."),
    ("post", "/v1/namespaces/{namespace}/cancel", "cancel", CaseRef, None, "Drop the open case (nothing written)."),
    ("get", "/v1/namespaces/{namespace}/history/{item_id}", "history", None, None,
     "Where a memory item came from and every case it was shown to."),
    ("get", "/v1/namespaces/{namespace}/explain/{case_id}", "explain", None, None,
     "What the agent saw on a case, what it answered, what memory learnt."),
    ("get", "/v1/namespaces/{namespace}/as_of", "as_of", None, None,
     "The memory as it was after seq `seq` (or after case index `case`)."),
    ("post", "/v1/namespaces/{namespace}/verify", "verify", None, None,
     "Re-execute the namespace from its record (chain, completeness, identical bytes)."),
    ("post", "/v1/namespaces/{namespace}/replay", "replay", ReplayRequest, None,
     "Seeded permutations of the namespace's cases (memory-dependent replies need the agent: Python API)."),
]


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of this server, built from the pydantic models (deterministic: committed
    as docs/openapi.json, and a test checks the committed copy is the one served)."""
    from grandrounds import __version__

    schemas: dict[str, Any] = {}

    def ref(model: type[BaseModel]) -> dict[str, str]:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in schema.pop("$defs", {}).items():
            schemas[name] = sub
        schemas[model.__name__] = schema
        return {"$ref": f"#/components/schemas/{model.__name__}"}

    problem = ref(Problem)
    paths: dict[str, Any] = {}
    for method, path, op_id, request, response, summary in _OPERATIONS:
        op: dict[str, Any] = {"operationId": op_id, "summary": summary}
        params = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                  for p in ("namespace", "item_id", "case_id") if "{" + p + "}" in path]
        if op_id == "as_of":
            params += [{"name": q, "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}}
                       for q in ("seq", "case")]
        if params:
            op["parameters"] = params
        if request is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref(request)}}}
        ok: dict[str, Any] = {"description": "OK"}
        ok["content"] = {"application/json": {"schema": ref(response) if response else {"type": "object"}}}
        op["responses"] = {"200": ok}
        if path != "/health":
            op["security"] = [{"bearer": []}]
            op["responses"]["401"] = {"description": "missing or wrong bearer token",
                                      "content": {"application/json": {"schema": problem}}}
            op["responses"]["404"] = {"description": "namespace not open",
                                      "content": {"application/json": {"schema": problem}}}
            op["responses"]["409"] = {"description": "another case is open, or the case is not the open one",
                                      "content": {"application/json": {"schema": problem}}}
            op["responses"]["422"] = {"description": "bad input: `field` names the first field at fault",
                                      "content": {"application/json": {"schema": problem}}}
        paths.setdefault(path, {})[method] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "grandrounds", "version": __version__,
                 "description": "A replayable, auditable memory for your own clinical agent."},
        "servers": [{"url": f"http://127.0.0.1:{DEFAULT_PORT}"}],
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.items())),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def openapi_json() -> str:
    """docs/openapi.json's exact text."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def serve(db: str, host: str, port: int, token_file: str | None) -> None:
    """Run the server until interrupted (uvicorn, one process: the file's one writer)."""
    import sys

    token, generated = server_token(host, token_file)
    if generated:
        print(f"grandrounds serve: no {TOKEN_ENV} or --token-file; this run's token (not stored anywhere):\n"
              f"  {token}", file=sys.stderr, flush=True)
    app = build_app(MemoryHub(db), token)
    run_uvicorn(app, host, port)


def listening_socket(host: str, port: int):
    """The server's socket with TCP_NODELAY, which accepted connections inherit: without it a response's
    headers and body leave as two segments and the second waits for the client's delayed ACK (~40 ms per
    request on Linux, measured: 44 ms for an empty route, 1 ms with it)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def run_uvicorn(app, host: str, port: int) -> None:
    import uvicorn

    sock = listening_socket(host, port)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
