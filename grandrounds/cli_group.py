"""The `grandrounds` command group and the progress bar the commands share.

Apart from cli.py so that the modules registering commands on the group (cli_replay, cli_kafka)
import it without importing cli.py, which imports them: no import cycle.
"""

from __future__ import annotations

import sys

import click

from grandrounds import __version__
from grandrounds.store.errors import GrandroundsError


class Main(click.Group):
    """The command group: a `GrandroundsError` a command lets escape exits with the code its class
    stands for (grandrounds/errors.py), never as a traceback."""

    def invoke(self, ctx: click.Context):
        as_json = "--json" in [*getattr(ctx, "_protected_args", []), *ctx.args]
        try:
            return super().invoke(ctx)
        except GrandroundsError as exc:
            from grandrounds.errors import fail_for

            fail_for(exc, as_json)


@click.group(cls=Main)
@click.version_option(__version__, prog_name="grandrounds")
def main() -> None:
    """Event-sourced streaming memory for clinical LLM agents."""


def progress(total: int, quiet: bool, unit: str = "case"):
    from tqdm import tqdm

    # Progress goes to stderr and only to a terminal, so --json stdout stays one object.
    return tqdm(total=total, unit=unit, desc=f"{unit}s", file=sys.stderr, disable=quiet or None, leave=False)
