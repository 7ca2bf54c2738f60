"""`grandrounds ui`: the read-only web view of a database, served on 127.0.0.1 (DESIGN §8)."""

from __future__ import annotations

from pathlib import Path

import click

from grandrounds.cli_group import main
from grandrounds.errors import fail


@main.command()
@click.option("--db", default="grandrounds.duckdb", show_default=True, help="DuckDB file holding the event log.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="Port on 127.0.0.1 (0: any free port, printed at start).")
def ui(db, port):
    """Browse runs, cases, memory items, time travel and tool governance in a web browser.

    The file is opened read-only and the server listens on 127.0.0.1 only; stop it with Ctrl-C.
    """
    import socket

    import uvicorn

    from grandrounds.store.eventstore import StoreError
    from grandrounds.ui.app import create_app

    if not Path(db).is_file():
        fail(f"no database file {db!r} (give --db the file a run wrote)", 2, False)
    from grandrounds.store.eventstore import EventStore
    from grandrounds.store.errors import InvalidInput
    from grandrounds.store.sealing import require_key_file

    try:
        with EventStore(db, read_only=True) as store:  # a lost key file said once, not as a 500 on every page
            require_key_file(store)
    except InvalidInput as exc:  # not a DuckDB file, a key file missing or unreadable
        fail(str(exc), 2, False)
    except StoreError as exc:
        fail(str(exc), 1, False)
    try:
        app = create_app(db)
    except StoreError as exc:
        fail(str(exc), 1, False)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(128)  # connections queue from here on: the address printed below already answers
    except OSError as exc:
        fail(f"cannot listen on 127.0.0.1:{port}: {exc.strerror} (give another --port)", 1, False)
    # The bound socket is handed to uvicorn, so the address printed is the one served (port 0 included).
    click.echo(f"grandrounds ui: http://127.0.0.1:{sock.getsockname()[1]}/  (db {db}, read-only; Ctrl-C stops)",
               err=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[sock])
