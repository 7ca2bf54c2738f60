"""Real-model learning benchmark: does memory help the local model on presentations that recur?

Runs `grandrounds run` with a real OpenAI-compatible model (the project's local model:
`grandrounds model serve`, Qwen2.5-Coder-1.5B-Instruct, temperature 0) on the recurring MCQ
stream (benchmarks/recurring_stream.py: the training stream, and a held-out stream of the same
shape), for `none`, the plain `precedent` and `long-context` baselines and the memory policies, each
- online: learning while it answers the held-out stream, and
- frozen: memory built on the training stream, then read-only on the held-out stream
  (`--memory-from`); `none` has no memory, so its online run is its only run;
and verifies every run by re-executing it from its recorded exchanges (`grandrounds verify`).
`long-context` (handlers/policies/long_context/) is the baseline recent work finds hard to beat: the
most recent past cases and their outcomes in the prompt, newest first, up to its token budget (3,000
estimated tokens), no retrieval; its rows say whether a memory policy beats simply remembering.
Prints one row per run: accuracy with its Wilson 95 % interval, answers from the last-step
fallback, cases without an answer, model calls, tokens and seconds per case, the run id and
the verify result. A 1.5 B coder model: its scores exercise the real path, they are not a
clinical claim.

    python benchmarks/bench_real_model.py --base-url http://127.0.0.1:18080/v1 --model qwen2.5-coder-1.5b \\
        --db /tmp/realbench.duckdb [--limit-train N] [--limit-test N] [--policies none,precedent,evo-medagent] \\
        [--modes online,frozen] [--json OUT.json]
    python benchmarks/bench_real_model.py ... --policies long-context --modes online,frozen   # the recurring rows
    python benchmarks/bench_real_model.py ... --chest 6 --policies long-context               # the ChestAgentBench row
    python benchmarks/bench_real_model.py --collect-replies OUT.json --base-url ... --model ... [--limit-test N]
    python benchmarks/bench_real_model.py --render benchmarks/results/real_model.json [--check]

`--render` writes the table of a recorded result file into docs/benchmarks.md between
`<!-- bench:real-model -->` and `<!-- /bench -->` (`--check`: exit 1 if the page differs), so
the page's numbers are the recorded ones (scripts/bench_docs.py renders it with every other
results file; tests/test_readme_bench.py checks them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import measured_line  # noqa: E402  (benchmarks/ is not a package)

TRAIN = ROOT / "examples" / "recurring_train.jsonl"
TEST = ROOT / "examples" / "recurring_test.jsonl"
POLICIES = ("none", "precedent", "long-context", "evo-medagent", "skemex", "selsm", "retrosum")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (round(max(0.0, c - h), 3), round(min(1.0, c + h), 3))


def head(path: Path, n: int | None, tmp: Path) -> Path:
    if n is None:
        return path
    out = tmp / f"{path.stem}-{n}.jsonl"
    out.write_text("".join(path.read_text().splitlines(keepends=True)[:n]))
    return out


SHARED_CHEST = ROOT.parent / "shared" / "data" / "chestagentbench_evomedagent" / "real_cases.json"


def chest_slice(source: Path, n_cases: int, tmp: Path) -> Path:
    """The second stream: every question of the first `n_cases` ChestAgentBench cases, in the file's
    order (`grandrounds convert --format chestagentbench`: text only, `case_descriptor` never read).
    A case's questions ask about the same patient and images, so what an earlier question's confirmed
    answer says about the findings is what memory can carry to the next one. Read from ../shared at
    run time, never copied into the repo."""
    if not source.exists():
        raise SystemExit(f"--chest: {source} not found (the shared benchmark data)")
    converted = tmp / "cab-all.jsonl"
    r = subprocess.run([sys.executable, "-m", "grandrounds", "convert", str(source), "--format", "chestagentbench",
                        "-o", str(converted)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"--chest: convert failed: {r.stderr[-400:]}")
    groups: list[str] = []
    keep: list[str] = []
    for line in converted.read_text().splitlines(keepends=True):
        group = json.loads(line)["case_id"].rsplit("-q", 1)[0]
        if group not in groups:
            if len(groups) == n_cases:
                break
            groups.append(group)
        keep.append(line)
    out = tmp / f"chestagentbench-{n_cases}-cases.jsonl"
    out.write_text("".join(keep))
    return out


def cli(*args: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "grandrounds", *args, "--json"], capture_output=True, text=True)
    lines = r.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        out = {}
    out["_exit"] = r.returncode
    if r.returncode != 0 and not out.get("run_id"):
        out["_error"] = (r.stderr or r.stdout)[-600:]
    return out


def row(policy: str, mode: str, out: dict, verify: dict, wall_s: float, stream: str = "recurring") -> dict:
    n, k = int(out.get("cases", 0)), int(out.get("correct", 0))
    llm, metrics = out.get("llm", {}), out.get("metrics", {})
    return {"stream": stream, "policy": policy, "mode": mode, "run_id": out.get("run_id"), "cases": n, "correct": k,
            "accuracy": round(k / n, 3) if n else None, "ci95": wilson(k, n),
            "fallback_answers": metrics.get("fallback_answers"), "unanswered": metrics.get("unanswered"),
            "answer_sources": metrics.get("answer_sources"), "failed": out.get("failed"),
            "reflections_failed": out.get("reflections_failed"), "calls": llm.get("calls"),
            "tokens": (llm.get("prompt_tokens", 0) + llm.get("completion_tokens", 0)) if llm else None,
            "s_per_case": round(llm.get("latency_ms_per_case", 0.0) / 1000, 2) if llm else None,
            "wall_s": round(wall_s, 1), "verified": verify.get("identical"), "error": out.get("_error")}


def run_policy(policy: str, mode: str, train: Path, test: Path, common: list[str], db: str,
               stream: str = "recurring") -> list[dict]:
    rows = []
    args = ["run", "--db", db, "--policy", policy, *common]
    if mode == "frozen":
        t0 = time.perf_counter()
        trained = cli(*args[:1], str(train), *args[1:], "--run-id", f"{policy}-train")
        rows.append(row(policy, "train", trained, cli("verify", "--db", db, f"{policy}-train"), time.perf_counter() - t0,
                        stream))
        extra = ["--memory-from", f"{policy}-train", "--run-id", f"{policy}-frozen"]
    else:
        extra = ["--run-id", f"{policy}-online"]
    t0 = time.perf_counter()
    out = cli(*args[:1], str(test), *args[1:], *extra)
    rid = out.get("run_id") or extra[-1]
    rows.append(row(policy, mode, out, cli("verify", "--db", db, rid), time.perf_counter() - t0, stream))
    return rows


def table(rows: list[dict]) -> str:
    head_ = ("| stream | policy | mode | accuracy (95% CI) | fallback | no answer | calls | tokens | s/case | run id "
             "| verified |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head_]
    for r in rows:
        acc = f"{r['correct']}/{r['cases']} = {r['accuracy']} ({r['ci95'][0]}–{r['ci95'][1]})" if r["cases"] else \
            f"error: {(r['error'] or '')[-80:]!r}"
        lines.append(f"| {r.get('stream', 'recurring')} | {r['policy']} | {r['mode']} | {acc} | {r['fallback_answers']} | {r['unanswered']} | "
                     f"{r['calls']} | {r['tokens']} | {r['s_per_case']} | {r['run_id']} | {r['verified']} |")
    return "\n".join(lines)


# The table lives on the docs site's benchmark page (scripts/bench_docs.py renders every results file there,
# this one through render_block).
README = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench:real-model -->", "<!-- /bench -->"


def render_block(doc) -> str:
    """The block between the markers for a recorded result document (rows + meta), markers included."""
    rows, meta = (doc["rows"], doc.get("meta", {})) if isinstance(doc, dict) else (doc, {})
    lines = [table(rows)]
    if meta:
        lines.append("")
        lines += [f"- {k}: {v}" for k, v in meta.items()]
    if isinstance(doc, dict) and "measured" in doc:
        lines.append(f"- {measured_line(doc, 'the real-model results')}")
    return f"{BEGIN}\n" + "\n".join(lines) + f"\n{END}"


def render_readme(result: Path, check: bool, readme: Path = README) -> int:
    """docs/benchmarks.md's block between the markers := the table of `result` (recorded rows + meta)."""
    block = render_block(json.loads(result.read_text()))
    text = readme.read_text()
    start = text.index(BEGIN)
    stop = text.index(END, start) + len(END)
    new = text[:start] + block + text[stop:]
    if check:
        if new != text:
            print(f"{readme.name}'s {BEGIN} block differs from {result}; run --render {result}", file=sys.stderr)
            return 1
        return 0
    tmp = readme.with_suffix(".md.tmp")
    tmp.write_text(new)
    os.replace(tmp, readme)
    return 0


def collect_replies(base_url: str, model: str, test: Path, out: Path) -> None:
    """Text-protocol final-step replies of the real model, for the alignment fixture
    (tests/fixtures/local_model_replies.json; a person adds `chosen` to each)."""
    import urllib.request

    from grandrounds.handlers.agent.guard import render
    from grandrounds.handlers.agent.react import SYSTEM, task_prompt
    from grandrounds.handlers.cases import load_cases
    from grandrounds.handlers.policies.render import render_prefix
    from grandrounds.store.event_types import MemoryRetrieved

    replies = []
    for case in load_cases(str(test))[0]:
        view = case.view()
        memory = MemoryRetrieved(memory_seq=0, prefix=render_prefix([], [], []))
        system = SYSTEM.format(max_steps=1, tools="none — answer with <response>.", tool_example="tool name")
        messages = render(system, task_prompt(view, memory), [], 1, True)
        body = {"model": model, "messages": messages, "temperature": 0, "max_tokens": 160}
        req = urllib.request.Request(f"{base_url.rstrip('/')}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        reply = json.loads(urllib.request.urlopen(req, timeout=1800).read())["choices"][0]["message"]["content"]
        replies.append({"case_id": case.case_id, "options": view.options, "reply": reply})
        print(json.dumps(replies[-1])[:300], flush=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"model": model, "replies": replies}, indent=1) + "\n")
    os.replace(tmp, out)


def write_json(path: Path, rows: list[dict]) -> None:
    tmp_out = path.with_suffix(".tmp")
    tmp_out.write_text(json.dumps(rows, indent=1) + "\n")
    os.replace(tmp_out, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url")
    ap.add_argument("--model")
    ap.add_argument("--render", type=Path, default=None, help="write this result file's table into docs/benchmarks.md")
    ap.add_argument("--check", action="store_true", help="with --render: exit 1 if docs/benchmarks.md differs")
    ap.add_argument("--db", default=None)
    ap.add_argument("--train", type=Path, default=TRAIN)
    ap.add_argument("--test", type=Path, default=TEST)
    ap.add_argument("--limit-train", type=int, default=None)
    ap.add_argument("--limit-test", type=int, default=None)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--modes", default="online,frozen")
    ap.add_argument("--actions", default="auto", choices=["auto", "schema", "text"])
    ap.add_argument("--max-steps", default=None)
    ap.add_argument("--json", dest="json_out", type=Path, default=None)
    ap.add_argument("--collect-replies", type=Path, default=None)
    ap.add_argument("--chest", type=int, default=None, metavar="N",
                    help="the second stream: all questions of the first N ChestAgentBench cases (online only)")
    ap.add_argument("--chest-source", type=Path, default=SHARED_CHEST)
    a = ap.parse_args()
    if a.render:
        return render_readme(a.render, a.check)
    if not (a.base_url and a.model):
        ap.error("--base-url and --model are required to run the benchmark")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        train, test = head(a.train, a.limit_train, tmp), head(a.test, a.limit_test, tmp)
        stream = "recurring"
        if a.chest:  # no training split: each case's later questions are the recurrence
            test = head(chest_slice(a.chest_source, a.chest, tmp), a.limit_test, tmp)
            stream = f"chestagentbench ({a.chest} cases, {len(test.read_text().splitlines())} questions)"
            a.modes = "online"
        if a.collect_replies:
            collect_replies(a.base_url, a.model, test, a.collect_replies)
            return 0
        db = a.db or str(tmp / "bench.duckdb")
        common = ["--backbone", "openai", "--base-url", a.base_url, "--model", a.model, "--actions", a.actions]
        if a.max_steps:
            common += ["--max-steps", a.max_steps]
        rows: list[dict] = []
        for policy in a.policies.split(","):
            # `none` has no memory to freeze: its one (online) run is the baseline for both modes
            for mode in (["online"] if policy == "none" else a.modes.split(",")):
                rows += run_policy(policy, mode, train, test, common, db, stream)
                print(table(rows[-1:]).splitlines()[-1], flush=True)
                if a.json_out:  # after every run, atomically: a long benchmark killed midway keeps its rows
                    write_json(a.json_out, rows)
        print("\nQwen2.5-Coder-1.5B-Instruct (a 1.5 B coder model) at temperature 0: exercises the real path; "
              "not a clinical claim.\n")
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
