"""The read-only web view (`grandrounds ui`): a Starlette app over one DuckDB file opened read-only.

Every page is a GET that reads; nothing here appends, and the file is opened with DuckDB's
read_only flag, so the view cannot change a run even by mistake. Bad references (an unknown run,
case or item, an as-of point outside the run) are the audit functions' own input errors, shown
as a 404 page with their message.
"""

from __future__ import annotations

import contextlib
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from grandrounds.handlers.deidentify import MEANINGS, PLACEHOLDERS
from grandrounds.replay.audit_common import AuditInputError, short
from grandrounds.replay.caselog import UnknownRun
from grandrounds.store.eventstore import EventStore
from grandrounds.ui import pages

if TYPE_CHECKING:  # loaded on the first verify request only (it brings in re-execution)
    from grandrounds.replay.verify import VerifyResult

INPUT_ERRORS = (AuditInputError, UnknownRun)

_MARKED = re.compile(r"\[(erased|" + "|".join(re.escape(p[1:-1]) for p in PLACEHOLDERS.values()) + r")\]")
_MEANING = {PLACEHOLDERS[kind][1:-1]: meaning for kind, meaning in MEANINGS.items()}


def marked(text) -> Markup:
    """Text with erased content and de-identification placeholders shown as such: "[erased]" (its
    subject's key was destroyed) and "[NAME]", "[AGE 90+]", ... (an identifier replaced before the item
    became memory) become spans titled with what they stand for ("an age over 89"); the text around them is escaped as usual. The view only
    ever has the stored, opened text: an erased original is not in the process to be shown."""
    def span(m: re.Match) -> str:
        kind = m.group(1)
        if kind == "erased":
            return '<span class="redacted erased" title="erased: the subject\'s key was destroyed">[erased]</span>'
        return (f'<span class="redacted placeholder" data-placeholder="{kind}" '
                f'title="{escape(_MEANING[kind].capitalize())} was removed before this became memory">[{kind}]</span>')
    return Markup(_MARKED.sub(span, str(escape("" if text is None else str(text)))))


def _templates() -> Environment:
    env = Environment(loader=PackageLoader("grandrounds.ui", "templates"), autoescape=select_autoescape(["html"]))
    env.filters["short"] = short
    env.filters["marked"] = marked
    env.filters["acc"] = lambda v: "–" if v is None else f"{v:.3f}"
    env.filters["fp"] = lambda v: v[:16] + "…" if v else "–"
    return env


def _int(value: str | None, name: str) -> int | None:
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise AuditInputError(f"{name} must be a whole number, not {value!r}") from None


class ViewApp:
    """The store, the templates and the re-execution results of this process (verify is costly:
    its result is kept, keyed by the fingerprint it checked, and shown on the runs page)."""

    def __init__(self, db: str | Path):
        self.db = str(db)
        self.store = EventStore(self.db, read_only=True)
        self.env = _templates()
        self.verified: dict[str, VerifyResult] = {}
        self._verify_lock = threading.Lock()

    def page(self, name: str, status: int = 200, **ctx) -> HTMLResponse:
        html = self.env.get_template(name).render(db=self.db, sim_note=pages.SIM_NOTE, **ctx)
        return HTMLResponse(html, status_code=status)

    def guarded(self, request: Request, build, template: str) -> Response:
        try:
            ctx = build()
        except INPUT_ERRORS as exc:
            return self.page("error.html", status=404, message=str(exc), path=request.url.path)
        return self.page(template, request=request, **ctx)

    # --- routes ---------------------------------------------------------------------------

    def runs(self, request: Request) -> Response:
        return self.guarded(request, lambda: pages.runs_page(self.store, self.verified), "runs.html")

    def run(self, request: Request) -> Response:
        rid = request.path_params["run_id"]
        return self.guarded(request, lambda: {"run_id": rid, **pages.run_page(
            self.store, rid, _int(request.query_params.get("window"), "window"))}, "run.html")

    def case(self, request: Request) -> Response:
        rid, ref = request.path_params["run_id"], request.path_params["case"]
        return self.guarded(request, lambda: {"run_id": rid, **pages.case_page(self.store, rid, ref)}, "case.html")

    def item(self, request: Request) -> Response:
        rid, item = request.path_params["run_id"], request.path_params["item"]
        return self.guarded(request, lambda: {"run_id": rid, **pages.item_page(self.store, rid, item)}, "item.html")

    def memory(self, request: Request) -> Response:
        rid, q = request.path_params["run_id"], request.query_params

        def build():
            case, seq = _int(q.get("case"), "case"), _int(q.get("seq"), "seq")
            sort = q.get("sort") or "id"
            return {"run_id": rid, "q": dict(q), **pages.memory_page(
                self.store, rid, case, seq, q.get("kind") or None, q.get("status") or None, sort)}

        return self.guarded(request, build, "memory.html")

    def diff(self, request: Request) -> Response:
        rid, q = request.path_params["run_id"], request.query_params

        def point(side: str) -> dict:
            case, seq = _int(q.get(f"{side}_case"), f"{side}_case"), _int(q.get(f"{side}_seq"), f"{side}_seq")
            return {k: v for k, v in (("as_of_case", case), ("as_of_seq", seq)) if v is not None}

        return self.guarded(request, lambda: {"run_id": rid, "q": dict(q), **pages.diff_page(
            self.store, rid, point("a"), point("b"))}, "diff.html")

    def tools(self, request: Request) -> Response:
        rid = request.path_params["run_id"]
        return self.guarded(request, lambda: {"run_id": rid, **pages.tools_page(self.store, rid)}, "tools.html")

    def verify(self, request: Request) -> Response:
        rid = request.path_params["run_id"]

        def build():
            from grandrounds.app import make_cache
            from grandrounds.replay.verify import NotVerifiable, verify_run

            try:
                with self._verify_lock:  # one re-execution at a time: each loads the embedder
                    res = verify_run(self.store, rid, make_cache(self.store))
            except NotVerifiable as exc:
                return {"run_id": rid, "v": None, "why": str(exc)}
            self.verified[rid] = res
            return {"run_id": rid, "v": res, "why": None}

        return self.guarded(request, build, "verify.html")


def create_app(db: str | Path) -> Starlette:
    view = ViewApp(db)
    routes = [
        Route("/", view.runs),
        Route("/runs/{run_id}", view.run),
        Route("/runs/{run_id}/cases/{case}", view.case),
        Route("/runs/{run_id}/items/{item}", view.item),
        Route("/runs/{run_id}/memory", view.memory),
        Route("/runs/{run_id}/diff", view.diff),
        Route("/runs/{run_id}/tools", view.tools),
        Route("/runs/{run_id}/verify", view.verify),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        view.store.close()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.view = view
    return app
