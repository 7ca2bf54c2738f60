"""The command-line reference, rendered from the click command objects themselves.

    python scripts/cli_reference.py            # print the reference as Markdown
    mkdocs build                               # mkdocs.yml loads this file as a hook

As a mkdocs hook it replaces the line `<!-- cli-reference -->` in docs/cli.md with one section per
command (groups first, then their subcommands, depth first), each holding that command's `--help`
text exactly as `grandrounds ... --help` prints it at 100 columns. A command added to the CLI
appears here without anyone writing a page for it; nothing is typed by hand.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator

import click

MARKER = "<!-- cli-reference -->"
WIDTH = 100


def _root() -> click.Command:
    from grandrounds.cli import main

    return main


def walk(cmd: click.Command, path: tuple[str, ...] = ("grandrounds",),
         parent: click.Context | None = None) -> Iterator[tuple[tuple[str, ...], click.Command, click.Context]]:
    """(path, command, context) for `cmd` and every subcommand under it, depth first, by name."""
    ctx = click.Context(cmd, info_name=path[-1], parent=parent, terminal_width=WIDTH, max_content_width=WIDTH)
    yield path, cmd, ctx
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            yield from walk(sub, path + (name,), ctx)


def anchor(path: tuple[str, ...]) -> str:
    return "-".join(path)


def render(root: click.Command | None = None) -> str:
    root = root or _root()
    entries = list(walk(root))
    out = ["| command | what it does |", "|---|---|"]
    for path, cmd, _ctx in entries[1:]:
        short = re.sub(r"([\\`*_\[\]<>|])", r"\\\1", cmd.get_short_help_str(limit=90) or "")
        out.append(f"| [`{' '.join(path)}`](#{anchor(path)}) | {short} |")
    out.append("")
    for path, cmd, ctx in entries:
        level = "#" * min(max(2, len(path)), 6)
        out.append(f"{level} `{' '.join(path)}` {{#{anchor(path)}}}")
        out.append("")
        out.append("```text")
        out.append(cmd.get_help(ctx).rstrip())
        out.append("```")
        out.append("")
    return "\n".join(out)


# mkdocs hook -------------------------------------------------------------------------------------

def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (the hook's signature)
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())


if __name__ == "__main__":
    sys.stdout.write(render() + "\n")
