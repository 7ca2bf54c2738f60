"""`grandrounds convert`: benchmark files to grandrounds case JSONL (DESIGN §7)."""

from __future__ import annotations

import json
from collections import Counter

import click

from grandrounds.errors import fail


@click.command()
@click.argument("source", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", required=True, type=click.Choice(["chestagentbench", "agentclinic-nejm"]),
              help="chestagentbench: real_cases.json; agentclinic-nejm: agentclinic_nejm*.jsonl.")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False), help="Case JSONL to write.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N records.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def convert(source, fmt, out, limit, as_json):
    """Convert a benchmark file to cases for `grandrounds run` (text only; gold kept for feedback)."""
    from grandrounds.handlers.environments.mcq_loaders import BenchmarkFormatError, load_benchmark, write_cases
    from grandrounds.store.dbfile import ProtectedOutput, check_output_path

    try:  # never a key file or a database (with or without one named): checked before anything is written
        check_output_path(out, None)
    except ProtectedOutput as exc:
        fail(str(exc), 2, as_json)
    try:
        cases = load_benchmark(fmt, source, limit)
    except FileNotFoundError:
        fail(f"{source}: file not found", 2, as_json)
    except (BenchmarkFormatError, ValueError, KeyError) as exc:
        fail(f"{source}: {exc}", 2, as_json)
    n = write_cases(cases, out)
    result = {"source": source, "format": fmt, "out": out, "cases": n,
              "categories": dict(sorted(Counter(c.category for c in cases).items()))}
    click.echo(json.dumps(result) if as_json else f"wrote {n} cases to {out}")
