"""`grandrounds mcp`: the memory as an MCP server (the official `mcp` SDK), for MCP-speaking assistants.

Tools `recall`, `record`, `feedback`, `explain` and `history`, the same operations as the Python API
(grandrounds/api.py) on the same kind of run: what an assistant does through them is verified, replayed
and browsed like any run. Transports: stdio (the default: the client starts the server as a child
process, so the server is the DuckDB file's one writer for the session) and streamable HTTP (bound to
127.0.0.1 unless told otherwise, behind the same bearer token as `grandrounds serve`).

Every tool takes an optional `namespace`; one the server has not opened yet is opened (created or
resumed) with the configuration the server was started with (`--policy`, `--agent`, `--cases`, ...).
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from grandrounds.api import CaseInput, FeedbackResult, MemoryHub, NamespaceConfig, Recall, Recorded
from grandrounds.errors import message_of, where_raised
from grandrounds.store.event_types import AgentStep
from grandrounds.store.llm_events import TokenUsage

INSTRUCTIONS = """A clinical agent's memory that learns from every case and keeps a replayable record.
For each multiple-choice case: call `recall` with the case (no gold answer needed) and show the returned `text`
to the agent; call `record` with the agent's answer (an option letter) and the ids (`ref`) of the items it
relied on; call `feedback` with the gold option letter once known. One case at a time per namespace.
`explain` shows what was seen on a case; `history` where a memory item came from."""


def build_server(hub: MemoryHub, namespace: str, config: NamespaceConfig) -> MCPServer:
    """The MCP server over `hub`; tools default to `namespace`, opened with `config` when first used."""
    server = MCPServer("grandrounds", instructions=INSTRUCTIONS)

    async def memory(ns: str | None):
        return await hub.open(ns or namespace, config)

    @server.tool()
    async def recall(case: CaseInput, namespace: str | None = None) -> Recall:
        """Read memory for a multiple-choice case and open it. Returns the context `text` to show the agent
        and the `items` (id, kind, relevance, why chosen). The gold `answer` may be left out."""
        return await (await memory(namespace)).recall(case, wait=30.0)

    @server.tool()
    async def record(case_id: str, answer: str, steps: list[AgentStep] | None = None, used: list[str] | None = None,
                     usage: TokenUsage | None = None, namespace: str | None = None) -> Recorded:
        """Record what the agent did on the open case: its answer (an option letter), its steps, the refs of
        the memory items it relied on (`rule:<id>` ...) and its token usage."""
        return await (await memory(namespace)).record(case_id, answer, steps, used, usage)

    @server.tool()
    async def feedback(case_id: str, outcome: str | None = None, namespace: str | None = None) -> FeedbackResult:
        """Give the open case's outcome (its gold option letter): the answer is graded, memory reflects and
        governs, the case is committed; returns the grade and the memory changes."""
        try:
            return await (await memory(namespace)).feedback(case_id, outcome)
        except Exception as exc:
            if where_raised(exc) is None:
                raise
            # escaped a case's stage: the server's failure, said with the case and stage (grandrounds/errors.py)
            raise ToolError(message_of(exc) + "; nothing of this case was written, the namespace's cases are "
                            "kept, and the case is still open: give its feedback again once the cause is fixed"
                            ) from exc

    @server.tool()
    async def explain(case_id: str, namespace: str | None = None) -> dict[str, Any]:
        """What the agent saw on a case (items, scores, provenance), what it answered, what memory learnt."""
        return await (await memory(namespace)).explain(case_id)

    @server.tool()
    async def history(item_id: str, namespace: str | None = None) -> dict[str, Any]:
        """Where a memory item (rule, episode, tool, skill) came from and every case it was shown to."""
        return await (await memory(namespace)).history(item_id)

    return server


def run_stdio(db: str, namespace: str, config: NamespaceConfig) -> None:
    hub = MemoryHub(db)
    server = build_server(hub, namespace, config)

    import asyncio

    async def main() -> None:
        try:
            await server.run_stdio_async()
        finally:
            await hub.aclose()

    asyncio.run(main())


def run_http(db: str, namespace: str, config: NamespaceConfig, host: str, port: int, token_file: str | None) -> None:
    """Streamable HTTP at /mcp, behind the bearer token (`grandrounds serve`'s rules)."""
    import contextlib
    import sys

    from starlette.middleware import Middleware

    from grandrounds.http_api import TOKEN_ENV, BearerAuth, run_uvicorn, server_token

    token, generated = server_token(host, token_file)
    if generated:
        print(f"grandrounds mcp: no {TOKEN_ENV} or --token-file; this run's token (not stored anywhere):\n"
              f"  {token}", file=sys.stderr, flush=True)
    hub = MemoryHub(db)
    app = build_server(hub, namespace, config).streamable_http_app(host=host)
    inner_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a):
        async with inner_lifespan(a):
            try:
                yield
            finally:
                await hub.aclose()

    app.router.lifespan_context = lifespan
    app.user_middleware.insert(0, Middleware(BearerAuth, token=token))
    run_uvicorn(app, host, port)
