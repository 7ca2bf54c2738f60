"""Human-readable rendering of command results (the `--json` path prints the object itself)."""

from __future__ import annotations

import click


def _curve_points(curve: list[float]) -> str:
    if not curve:
        return "-"
    n = len(curve)
    # 10/25/50/75/100 % of the stream; on a short stream several fractions land on one case,
    # which is shown once.
    points = sorted({max(1, round(frac * n)) for frac in (0.1, 0.25, 0.5, 0.75, 1.0)})
    return "  ".join(f"{i}:{curve[i - 1]:.2f}" for i in points)


_EVO_KEYS = ("episodes", "rules", "rules_by_priority", "rules_retired", "tools", "tool_labels")


def _flat(value) -> str:
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k} {v}" for k, v in value.items()) + ")"
    return str(value)


def memory_line(summary: dict) -> str:
    """Evo-MedAgent's episodes and rules, or the counts another policy's memory reports."""
    mem = summary["memory"]
    if summary.get("policy") in ("evo-medagent", "none"):
        pr = mem["rules_by_priority"]
        return (f"episodes {mem['episodes']} · rules {mem['rules']} "
                f"(P0 {pr['0']}, P1 {pr['1']}, P2 {pr['2']}; {mem['rules_retired']} retired)")
    return " · ".join(f"{k.replace('_', ' ')} {_flat(v)}" for k, v in mem.items() if k not in _EVO_KEYS) or "-"


def render_run(summary: dict, db: str, note: str) -> str:
    mem = summary["memory"]
    tools = ", ".join(f"{k}={v}" for k, v in mem["tools"].items()) or "none offered (add --sim-tool NAME=RELIABILITY)"
    lines = [
        click.style(f"run {summary['run_id']}", bold=True)
        + f"  policy {summary['policy']} · backbone {summary['backbone']} · seed {summary['seed']} · db {db}",
        f"  cases        {summary['cases']}   correct {summary['correct']}   accuracy {summary['accuracy']:.3f}",
        f"  cumulative   {_curve_points(summary['cumulative_accuracy'])}   (cases:accuracy so far)",
        f"  memory       {memory_line(summary)}",
        f"  tools        {tools}",
        f"  events       {summary['events']}",
        f"  fingerprint  {summary['fingerprint']}",
    ]
    if summary.get("chain_head"):  # with the fingerprint, what to publish for `verify --expect(-head)`
        lines.append(f"  chain head   {summary['chain_head']}")
    key_file = summary.get("key_file")
    if key_file:
        lines.append(f"  key file     {key_file['path']}")
        if key_file.get("warning"):
            lines.append(click.style(f"  warning: {key_file['warning']}", fg="yellow"))
    if note:
        lines.append(click.style(f"  note: {note}", fg="yellow"))
    return "\n".join(lines)
