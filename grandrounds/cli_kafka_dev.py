"""`grandrounds kafka fetch | dev`: Apache Kafka for a user's machine without Docker or Maven."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import click

from grandrounds.cli_group import main
from grandrounds.errors import fail


@main.group()
def kafka():
    """A local Apache Kafka broker from Maven Central's jars (needs Java 17+, not Docker or Maven)."""


def _fetch(libs: str | None, quiet: bool) -> Path:
    from grandrounds.kafka_dev.jars import JarFetchError, fetch, kafka_version, libs_dir, libs_path

    path = Path(libs) if libs else libs_path()
    if libs_dir(path) is None and not quiet:
        click.echo(f"fetching Apache Kafka {kafka_version()} jars from Maven Central into {path} …", err=True)

    def progress(jar, what: str) -> None:
        if not quiet:
            click.echo(f"  {jar.filename}: {what}", err=True)

    try:
        return fetch(path, progress=progress)
    except JarFetchError as exc:
        fail(str(exc), 1, quiet)


@kafka.command("fetch")
@click.option("--libs", default=None, metavar="DIR",
              help="Jar folder (default: $KAFKA_LIBS or ~/.cache/grandrounds/kafka-libs).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def fetch_cmd(libs, as_json):
    """Download the broker's jars (sha1 checked against the list and Maven Central's .sha1), cached."""
    from grandrounds.kafka_dev.jars import jar_list, kafka_version

    path = _fetch(libs, as_json)
    out = {"libs": str(path), "jars": len(jar_list()), "kafka_version": kafka_version()}
    click.echo(json.dumps(out) if as_json else f"{out['jars']} jars of Apache Kafka {out['kafka_version']} in {path}")


@kafka.command("dev")
@click.option("--port", default=9092, show_default=True, type=click.IntRange(1, 65535), help="Client port on 127.0.0.1.")
@click.option("--controller-port", default=9093, show_default=True, type=click.IntRange(1, 65535))
@click.option("--data", default=None, metavar="DIR",
              help="Broker data (kept between starts; default ~/.cache/grandrounds/kafka-dev).")
@click.option("--libs", default=None, metavar="DIR", help="Jar folder (default: $KAFKA_LIBS or ~/.cache/grandrounds/kafka-libs).")
def dev(port, controller_port, data, libs):
    """Fetch the jars if needed, then run a single-node KRaft broker on 127.0.0.1 until Ctrl-C.

    Then, in another terminal: grandrounds worker --broker kafka://127.0.0.1:PORT --db worker.duckdb
    """
    from grandrounds.kafka_dev.broker import DEFAULT_DATA, BrokerError, DevBroker

    if port == controller_port:
        fail("--port and --controller-port must differ", 2, False)
    path = _fetch(libs, False)
    try:
        broker = DevBroker(path, Path(data) if data else DEFAULT_DATA, port, controller_port)
        click.echo(f"starting Apache Kafka on {broker.bootstrap} (data {broker.data}, log {broker.log_path}) …",
                   err=True)
        broker.start()
    except BrokerError as exc:
        fail(str(exc), 1, False)
    click.echo(f"Kafka is serving on kafka://{broker.bootstrap}  (Ctrl-C stops it)", err=True)

    def stop(signum, frame):
        raise KeyboardInterrupt

    # Both, explicitly: a shell starting this in the background leaves SIGINT ignored.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        rc = broker.wait()
    except KeyboardInterrupt:
        click.echo("stopping the broker …", err=True)
        broker.stop()
        return
    fail(f"the broker exited with code {rc}\n{broker.log_tail()}", 1, False)
