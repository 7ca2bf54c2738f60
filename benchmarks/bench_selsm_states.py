"""What SELSM's states give the embedder on the official MedAgentBench tasks: whole, or within its window.

    python benchmarks/bench_selsm_states.py [--limit N] [--json benchmarks/results/selsm_states.json]

Runs `grandrounds run test_data_v2.json --env medagentbench --policy selsm` in this process (sim backbone:
scripted trajectories, not a model's; its accuracy is not a clinical measure) under the preset (`state_view
= 2`: handlers/policies/selsm/state_view.py) and under `--ablation whole-state` (`state_view = 1`, the
whole text, as runs before issue 44), and records every state text handed to the embedder — the stored
records' states as memory folds them and the live states the agent loops retrieve with — counted in
all-MiniLM-L6-v2's own wordpieces (store/wordpieces.py). The model reads 256 of them ([CLS] and [SEP]
included) and drops the rest unread. Needs the shared data (`../shared/data/medagentbench`,
`../shared/data/medagentbench_rl_fork`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT / "benchmarks"))
import provenance  # noqa: E402

TASKS = DATA / "medagentbench" / "test_data_v2.json"
FUNCS = DATA / "medagentbench" / "funcs_v1.json"
PATIENTS = DATA / "medagentbench_rl_fork" / "patients_from_snapshot.json"
VIEWS = {"state_view = 2 (preset)": [], "state_view = 1 (--ablation whole-state)": ["--ablation", "whole-state"]}


def run(extra: list[str], folder: Path, limit: int | None) -> tuple[dict, list[str]]:
    """The run's --json summary and every state text the embedder was given (with repeats)."""
    from click.testing import CliRunner

    from grandrounds.cli import main
    from grandrounds.handlers.policies.selsm import memory, policy, state_view

    seen: list[str] = []

    def recording(state: str, view: int = state_view.WINDOWED) -> str:
        text = state_view.embedded_state(state, view)
        seen.append(text)
        return text

    patched = [(memory, memory.embedded_state), (policy, policy.embedded_state)]
    for mod, _ in patched:
        mod.embedded_state = recording
    try:
        args = ["run", str(TASKS), "--env", "medagentbench", "--funcs", str(FUNCS), "--patients", str(PATIENTS),
                "--policy", "selsm", *extra, "--db", str(folder / f"s{len(os.listdir(folder))}.duckdb"), "--json",
                *(["--limit", str(limit)] if limit else [])]
        res = CliRunner().invoke(main, args, env={"OPENAI_BASE_URL": ""})
    finally:
        for mod, fn in patched:
            mod.embedded_state = fn
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.exit_code != 0 or not lines:
        raise SystemExit(f"{extra}: exit {res.exit_code}\n{res.output[-2000:]}")
    return json.loads(lines[-1]), seen


def summary(texts: list[str]) -> dict:
    from grandrounds.store import wordpieces

    budget = wordpieces.text_budget()
    distinct = sorted(set(texts))
    pieces = [wordpieces.count(t) for t in distinct]
    return {"distinct": len(distinct), "over": sum(p > budget for p in pieces), "max": max(pieces, default=0),
            "dropped": sum(max(0, p - budget) for p in pieces), "budget": budget}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="only the first N tasks (default: all the sandbox grades)")
    ap.add_argument("--json", default=None, help="write the results file here")
    args = ap.parse_args()
    at = provenance.measured()
    for path in (TASKS, FUNCS, PATIENTS):
        if not path.exists():
            raise SystemExit(f"shared data absent: {path}")
    rows, raw = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in VIEWS.items():
            out, texts = run(extra, Path(tmp), args.limit)
            s = summary(texts)
            raw[name] = {**s, "fingerprint": out.get("fingerprint"), "correct": out["correct"], "cases": out["cases"]}
            rows.append([name, str(out["cases"]), str(s["distinct"]), str(s["max"]), f"{s['over']}/{s['distinct']}",
                         str(s["dropped"]), f"{out['correct']}/{out['cases']}"])
    doc = {
        "title": "SELSM's states as the embedder sees them, official MedAgentBench tasks",
        "about": ("Every state text SELSM handed all-MiniLM-L6-v2 (stored records' states and the live states "
                  "retrieved with, distinct texts) on the tasks of types 1, 2, 3 and 8 the local sandbox grades, "
                  "sim backbone (scripted trajectories, not a model's: its accuracy is not a clinical measure), "
                  "counted in the model's wordpieces. The model reads 254 of a text's pieces and drops the rest "
                  "unread (\"pieces dropped\", summed over the texts)."),
        "source": "python benchmarks/bench_selsm_states.py --json benchmarks/results/selsm_states.json",
        "columns": ["state view", "tasks", "state texts embedded", "most wordpieces", "past the window",
                    "pieces dropped", "sim correct"],
        "rows": rows,
        "notes": ["The view: the query's head, the latest steps with their actions and abbreviated observations, "
                  "within 254 wordpieces (handlers/policies/selsm/state_view.py); a state that fits is embedded "
                  "whole, as the paper embeds s_t."],
        "raw": raw,
    }
    print(json.dumps(doc["rows"], indent=1))
    if args.json:
        provenance.write_results(args.json, {**doc, "measured": at})


if __name__ == "__main__":
    main()
