"""Helpers for tests that drive the command line: a few of the example cases, and a command's --json answer."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from grandrounds.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "cases.jsonl"


def example_cases(folder: Path, n: int, name: str = "cases.jsonl") -> Path:
    """The first `n` example cases as a case file in `folder`."""
    path = folder / name
    path.write_text("".join(EXAMPLES.read_text(encoding="utf-8").splitlines(keepends=True)[:n]), encoding="utf-8")
    return path


def cli_json(*args, env: dict | None = None) -> tuple[int, dict]:
    """`grandrounds ARGS --json`: the exit code and the last line it printed, parsed ({"output": ...} when
    it printed nothing on stdout, so a failed assertion shows what it said)."""
    res = CliRunner().invoke(main, [*map(str, args), "--json"], env=env)
    lines = res.stdout.strip().splitlines()
    return res.exit_code, (json.loads(lines[-1]) if lines else {"output": res.output})
