"""`grandrounds serve` (HTTP API) and `grandrounds mcp` (MCP server): your own agent's memory as a service."""

from __future__ import annotations

import click

from grandrounds.cli_group import main
from grandrounds.errors import BAD_INPUT, fail

_POLICIES = ["evo-medagent", "skemex", "selsm", "retrosum", "none"]


def _db_file(db: str) -> str:
    from grandrounds.store.dbfile import db_file

    try:
        return db_file(db)  # a DuckDB file or nothing yet
    except BAD_INPUT as exc:
        fail(str(exc), 2, False)


@main.command()
@click.option("--db", default="grandrounds.duckdb", show_default=True, help="DuckDB file holding the event log.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. A non-loopback one needs a configured token.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535))
@click.option("--token-file", default=None, metavar="PATH",
              help="File whose first line is the bearer token (else $GRANDROUNDS_API_TOKEN; on loopback without "
                   "either, a one-off token is printed on stderr). Never written to the database.")
@click.option("--openapi", "print_openapi", is_flag=True, help="Print the OpenAPI document and exit.")
def serve(db, host, port, token_file, print_openapi):
    """The Python API over HTTP: recall, record, feedback, history, explain, as_of, verify, replay.

    The server is the DuckDB file's one writer; every route but /health needs
    `Authorization: Bearer <token>`. GET /openapi.json describes it.
    """
    from grandrounds.http_api import openapi_json, serve as run_server, server_token

    if print_openapi:
        click.echo(openapi_json(), nl=False)
        return
    try:
        server_token(host, token_file)  # refuse before the file is opened
    except (*BAD_INPUT, OSError) as exc:
        fail(str(exc), 2, False)
    run_server(_db_file(db), host, port, token_file)


@main.command()
@click.option("--db", default="grandrounds.duckdb", show_default=True, help="DuckDB file holding the event log.")
@click.option("--namespace", default="mcp", show_default=True, help="Namespace (run id) tools use by default.")
@click.option("--policy", type=click.Choice(_POLICIES), default="evo-medagent", show_default=True,
              help="Policy a namespace is created with.")
@click.option("--agent", "agent_name", default="agent", show_default=True,
              help="The agent's name, recorded as the model of its replies.")
@click.option("--cases", default=None, type=click.IntRange(min=1),
              help="Cases a new namespace declares (a complete run after the last; default: open-ended).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--source", default=None, help="What the cases come from, recorded in run.started.")
@click.option("--transport", type=click.Choice(["stdio", "streamable-http"]), default="stdio", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="streamable-http: address to bind.")
@click.option("--port", default=8766, show_default=True, type=click.IntRange(1, 65535))
@click.option("--token-file", default=None, metavar="PATH",
              help="streamable-http: bearer token file (else $GRANDROUNDS_API_TOKEN; see `serve`).")
def mcp(db, namespace, policy, agent_name, cases, seed, source, transport, host, port, token_file):
    """An MCP server with tools recall, record, feedback, explain and history (stdio by default)."""
    from grandrounds.api import NamespaceConfig
    from grandrounds.mcp_server import run_http, run_stdio

    config = NamespaceConfig(policy=policy, agent=agent_name, cases=cases, seed=seed, source=source)
    if transport == "stdio":
        run_stdio(_db_file(db), namespace, config)
        return
    from grandrounds.http_api import server_token

    try:
        server_token(host, token_file)
    except (*BAD_INPUT, OSError) as exc:
        fail(str(exc), 2, False)
    run_http(_db_file(db), namespace, config, host, port, token_file)
