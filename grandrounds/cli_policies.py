"""`grandrounds policies`: the shipped presets, their parameters and ablation switches."""

from __future__ import annotations

import json

import click

from grandrounds.errors import fail


def describe(name: str) -> dict:
    """One preset: its file, every parameter with its value and meaning, its ablation switches."""
    from grandrounds.handlers.policies.config import PRESET_DIR, load_policy

    policy = load_policy(name)
    fields = type(policy).model_fields
    params = {k: {"value": v, "doc": (fields[k].description or "").strip()}
              for k, v in policy.model_dump(mode="json").items() if k != "name"}
    return {"name": name, "file": str(PRESET_DIR / f"{name}.toml"), "summary": (type(policy).__doc__ or "").strip(),
            "parameters": params, "ablations": {k: dict(v) for k, v in policy.ablations.items()}}


@click.command("policies")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def policies(name, as_json):
    """List the policy presets (or show NAME) with their parameters and ablation switches."""
    from grandrounds.handlers.policies.config import PolicyError, preset_names

    names = preset_names()
    if name is not None and name not in names:
        fail(f"no preset {name!r} (presets: {', '.join(names)})", 2, as_json)
    try:
        described = [describe(n) for n in ([name] if name else names)]
    except PolicyError as exc:  # a shipped preset that does not validate is a bug, but say which
        fail(str(exc), 1, as_json)
    if as_json:
        click.echo(json.dumps({"policies": described}))
        return
    for d in described:
        click.echo(f"{d['name']}  ({d['file']})")
        if d["summary"]:
            click.echo(f"  {d['summary'].splitlines()[0]}")
        for key, p in d["parameters"].items():
            doc = p["doc"].splitlines()[0] if p["doc"] else ""
            click.echo(f"    {key:<28} {json.dumps(p['value']):<16} {doc}")
        if d["ablations"]:
            click.echo("  ablations (--ablation NAME on run and replay):")
            for sw, sets in d["ablations"].items():
                click.echo(f"    {sw:<28} sets {', '.join(f'{k}={json.dumps(v)}' for k, v in sets.items())}")
        click.echo("")
