"""The `grandrounds` command line (DESIGN §8). Every command has `--json`."""

from __future__ import annotations

import json
import os
import sys

import click

from grandrounds import __version__
from grandrounds.errors import BAD_INPUT, fail
from grandrounds.output import render_run


@click.group()
@click.version_option(__version__, prog_name="grandrounds")
def main() -> None:
    """Event-sourced streaming memory for clinical LLM agents."""


@main.command()
@click.argument("cases_file", metavar="CASES.jsonl", type=click.Path(dir_okay=False))
@click.option("--db", default="grandrounds.duckdb", show_default=True, help="DuckDB file holding the event log.")
@click.option("--run-id", default=None, help="Run id (default: derived from policy, backbone, seed and cases).")
@click.option("--policy", default="evo-medagent", show_default=True, help="Preset name or TOML policy file.")
@click.option("--backbone", default=None, help="sim (default without a model endpoint).")
@click.option("--model", default=None, help="Model name for a real backbone.")
@click.option("--base-url", default=None, help="OpenAI-compatible endpoint for a real backbone.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--lag", default=0, show_default=True, type=click.IntRange(min=0),
              help="Cases in flight; 0 = strict order (the embedded runner is always strict).")
@click.option("--broker", default="memory", show_default=True, help="memory (embedded) or kafka://HOST:PORT.")
@click.option("--sim-tool", "sim_tools", multiple=True, metavar="NAME=RELIABILITY",
              help="Offer a simulated tool of fixed reliability (repeatable; sim backbone).")
@click.option("--commit", type=click.Choice(["stage", "case"]), default="stage", show_default=True,
              help="Flush events per stage (safest) or per case (faster bulk runs).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def run(cases_file, db, run_id, policy, backbone, model, base_url, seed, lag, broker, sim_tools, commit, as_json):
    """Stream CASES.jsonl through retrieve → act → feedback → reflect → govern."""
    from handlers.cases import load_cases
    from handlers.policies.config import load_policy
    from handlers.runs import RunSpec
    from handlers.tools import parse_tool_spec

    note = ""
    try:
        cases, source = load_cases(cases_file)
        pol = load_policy(policy)
        if backbone is None:
            backbone = "sim"
            if os.environ.get("OPENAI_BASE_URL") or base_url:
                note = "a model endpoint is configured but --backbone was not given: using the offline sim backbone"
        tools: dict[str, float] = {}
        for spec in sim_tools:
            name, r = parse_tool_spec(spec)
            tools[name] = r
        if tools and backbone != "sim":
            raise click.BadParameter("--sim-tool works with the sim backbone only")
        if broker != "memory":
            raise click.BadParameter(f"broker {broker!r}: only the embedded broker ('memory') is available in this build")
        run_spec = RunSpec(policy=pol, backbone=backbone, model=model, seed=seed, lag=lag, tools=tools, source=source)
    except BAD_INPUT as exc:
        fail(str(exc), 2, as_json)
    except (ValueError, click.BadParameter) as exc:
        fail(str(exc.message if isinstance(exc, click.BadParameter) else exc), 2, as_json)

    from grandrounds.app import run_cases
    from store.eventstore import EventStore, StoreError

    try:
        with EventStore(db) as store:
            bar = _progress(len(cases), as_json)
            tally = [0, 0]  # seen, correct

            def on_case(index: int, ok: bool) -> None:
                tally[0] += 1
                tally[1] += ok
                bar.update(1)
                bar.set_postfix_str(f"acc {tally[1] / tally[0]:.2f}", refresh=False)

            try:
                outcome = run_cases(store, cases, run_spec, run_id=run_id, commit=commit, on_case=on_case)
            finally:
                bar.close()
    except BAD_INPUT as exc:
        fail(str(exc), 2, as_json)
    except StoreError as exc:
        fail(str(exc), 1, as_json)
    summary = outcome.summary
    notes = [n for n in (note, outcome.note) if n]
    if outcome.processed_now == 0:
        notes.append(f"run {summary['run_id']} was already complete in {db}; showing its result")
    if as_json:
        summary = dict(summary, db=db, notes=notes)
        click.echo(json.dumps(summary))
    else:
        click.echo(render_run(summary, db, " | ".join(notes)))


def _progress(total: int, quiet: bool):
    from tqdm import tqdm

    # Progress goes to stderr and only to a terminal, so --json stdout stays one object.
    return tqdm(total=total, unit="case", desc="cases", file=sys.stderr, disable=quiet or None, leave=False)


if __name__ == "__main__":
    main()
