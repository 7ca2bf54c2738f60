"""Stored memory under the field de-identifier, for every policy (issue 41, part 4).

    python benchmarks/bench_deidentify_memory.py [--sample N] [--repeats R]
        [--json benchmarks/results/deidentify_memory.json]

Each policy runs (`grandrounds run`, the sim backbone, the policy's defaults: pattern set 3) on each stream,
with an empty machine cache of its own (a temporary folder), and the benchmark reads what its writer stored:
- **Content-word retention of stored memory** on identifier-free streams: `examples/cases.jsonl`, and from
  the shared data (`../shared/data`, skipped when absent) the first N ChestAgentBench questions, the first
  N AgentClinic NEJM cases (as MCQ) and the first N AgentClinic MedQA cases (`--env agentclinic`, for the
  policies that run OSCE dialogues). Every memory event the policy writes is compared
  with what it held before de-identification (the writer's `Deidentifier.scrub_dumped`, wrapped here): the
  share of its content-word occurrences (bench_deidentify.py `kept_share`) the stored event still holds.
- **Identifier hits across subjects** on the authored free-text PHI streams (tests/fixtures/
  freetext_identifiers*.jsonl and their truth files; the third, and the identifier-free
  clinical_eponyms_heldout.jsonl, were authored blind as held-out checks: tests/fixtures/HELDOUT.md): any identifier of a patient in any event of another
  patient's case, or in any memory event (tests/freetext_leaks.py `count_hits`).
- **Milliseconds a text**, p50 over the identifier-free case texts: cold (the tool, its filters loaded
  before), from the machine cache (a new process's first read: the process memo cleared), from the memo.
- **The README main job** (`grandrounds run examples/cases.jsonl`), warm (its texts' spans and vectors in
  the machine cache), beside the same job with the de-identifier replaced by the identity (every memory
  event stored as written), alternating, R runs each, in child processes: the median of each and their ratio.

`sim` is a test tool: its accuracy is not a clinical measure, and none is reported here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
import provenance  # noqa: E402

from bench_deidentify import content_words, kept_share  # noqa: E402
from freetext_leaks import (EPONYMS_HELDOUT, FIXTURE, FIXTURE_2, FIXTURE_3, POLICIES, count_hits,  # noqa: E402
                            truth_of)

from grandrounds.handlers import deidentify, field_deidentifier as tool  # noqa: E402
from grandrounds.handlers.deidentify import case_text  # noqa: E402
from grandrounds.handlers.environments.mcq_loaders import (load_agentclinic_nejm, load_chestagentbench,  # noqa: E402
                                                            write_cases)

EXAMPLES = ROOT / "examples" / "cases.jsonl"
CHEST = DATA / "chestagentbench_evomedagent" / "real_cases.json"
MEDQA = DATA / "agentclinic" / "agentclinic_medqa.jsonl"
NEJM = DATA / "agentclinic" / "agentclinic_nejm.jsonl"

IDENTITY = """\
import sys
from grandrounds.handlers import deidentify
# the de-identifier replaced by the identity: every memory event stored as the policy wrote it
deidentify.Deidentifier.scrub_dumped = lambda self, payload, case_id: (payload, payload.model_dump(mode="json"))
from grandrounds.cli import main
main(sys.argv[1:])
"""


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() if k not in deidentify._KEEP for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


class Recorder:
    """Wraps the writer's de-identifier: each memory event before and after, as its strings."""

    def __init__(self) -> None:
        self.pairs: list[tuple[str, str]] = []
        self._real = deidentify.Deidentifier.scrub_dumped

    def __enter__(self) -> Recorder:
        real, pairs = self._real, self.pairs

        def scrub_dumped(de, payload, case_id):
            out = real(de, payload, case_id)
            if type(payload).carries_memory:
                before = payload.model_dump(mode="json")
                after = out[1] if out[1] is not None else out[0].model_dump(mode="json")
                pairs.append(("\n".join(_strings(before)), "\n".join(_strings(after))))
            return out

        deidentify.Deidentifier.scrub_dumped = scrub_dumped
        return self

    def __exit__(self, *exc) -> None:
        deidentify.Deidentifier.scrub_dumped = self._real


def run(policy: str, cases: Path, db: Path, extra_args: list[str]) -> tuple[dict, list]:
    """(`run --json` output, the run's stored events) of one policy on one stream, in this process."""
    from click.testing import CliRunner

    from grandrounds.cli import main
    from grandrounds.store.eventstore import EventStore

    toml = db.with_suffix(".toml")
    toml.write_text(POLICIES[policy], encoding="utf-8")
    res = CliRunner().invoke(main, ["run", str(cases), "--db", str(db), "--policy", str(toml), "--backbone", "sim",
                                    "--json", *extra_args])
    lines = [ln for ln in res.output.splitlines() if ln.startswith("{")]
    if res.exit_code == 2 and "does not handle" in res.output:
        raise Unsupported(res.output.strip().splitlines()[-1])
    if res.exit_code != 0 or not lines:
        raise SystemExit(f"{policy} on {cases.name}: exit {res.exit_code}\n{res.output[-2000:]}")
    out = json.loads(lines[-1])
    with EventStore(str(db), read_only=True) as s:
        return out, s.read(out["run_id"])


def identifier_free_streams(tmp: Path, sample: int) -> dict[str, tuple[Path, list[str]]]:
    streams = {"examples/cases.jsonl": (EXAMPLES, []), "held-out eponyms (authored blind)": (EPONYMS_HELDOUT, [])}
    if CHEST.exists():
        chest = tmp / "chest.jsonl"
        write_cases(load_chestagentbench(CHEST, limit=sample), chest)
        streams[f"ChestAgentBench, first {sample} questions"] = (chest, [])
    if NEJM.exists():
        nejm = tmp / "nejm.jsonl"
        n = write_cases(load_agentclinic_nejm(NEJM, limit=sample), nejm)
        streams[f"AgentClinic NEJM, {n} cases"] = (nejm, [])
    if MEDQA.exists():
        streams[f"AgentClinic MedQA OSCE, first {sample} cases"] = (MEDQA, ["--env", "agentclinic", "--limit",
                                                                           str(sample)])
    return streams


class Unsupported(Exception):
    """The policy does not run on this kind of case (the CLI refuses it before writing anything)."""


def memory(tmp: Path, sample: int) -> tuple[list[dict], list[dict]]:
    retention, hits = [], []
    streams = identifier_free_streams(tmp, sample)
    for policy in POLICIES:
        for name, (path, extra) in streams.items():
            with Recorder() as rec:
                try:
                    out, _ = run(policy, path, tmp / f"{policy}-{len(retention)}.duckdb", extra)
                except Unsupported as why:
                    retention.append({"policy": policy, "stream": name, "unsupported": str(why)})
                    print(json.dumps(retention[-1]), flush=True)
                    continue
            kept = total = 0
            lost: dict[str, int] = {}
            for before, after in rec.pairs:
                k, n = kept_share(before, after)
                kept, total = kept + k, total + n
                left = content_words(after)
                for w in content_words(before):
                    if w in left:
                        left.remove(w)
                    else:
                        lost[w] = lost.get(w, 0) + 1
            retention.append({"policy": policy, "stream": name, "cases": out["cases"], "memory_events": len(rec.pairs),
                              "content_words": total, "kept": round(kept / total, 4) if total else None,
                              "placeholders": out.get("deidentified", {}),
                              "most_lost": [w for w, _ in sorted(lost.items(), key=lambda kv: (-kv[1], kv[0]))[:8]]})
            print(json.dumps(retention[-1]), flush=True)
        for stream in (FIXTURE, FIXTURE_2, FIXTURE_3):
            out, events = run(policy, stream, tmp / f"{policy}-phi-{stream.stem}.duckdb", [])
            found = count_hits(events, truth_of(stream))
            hits.append({"policy": policy, "stream": f"tests/fixtures/{stream.name}", "cases": out["cases"],
                         "hits": found["hits"], "pairs": found["pairs"], "examples": found["examples"]})
            print(json.dumps(hits[-1]), flush=True)
    return retention, hits


def _p50(xs: list[float], digits: int = 3) -> float:
    return round(statistics.median(xs), digits)


def per_text(texts: list[str], folder: Path) -> dict:
    """find() cold (the tool), from the machine cache (memo cleared), from the memo; milliseconds p50."""
    def timed() -> list[float]:
        out = []
        for t in texts:
            a = time.perf_counter()
            tool.find(t)
            out.append((time.perf_counter() - a) * 1000)
        return out

    os.environ["GRANDROUNDS_EMBEDDING_CACHE"] = "off"
    tool._MEMO.clear()
    tool._tool()  # (the filters load once a process: not a text's cost)
    cold = timed()
    os.environ["GRANDROUNDS_EMBEDDING_CACHE"] = str(folder)
    tool._MEMO.clear()
    timed()  # fills the machine cache
    tool._MEMO.clear()
    cached = timed()
    memo = timed()
    return {"texts": len(texts), "cold_p50_ms": _p50(cold), "machine_cache_p50_ms": _p50(cached, 4),
            "memo_p50_ms": _p50(memo, 5)}


def job(tmp: Path, repeats: int) -> dict:
    """The README main job warm, with the field de-identifier and with the identity, alternating."""
    env = {**os.environ, "GRANDROUNDS_EMBEDDING_CACHE": str(tmp / "job-cache"), "OPENAI_BASE_URL": "",
           "OPENAI_API_KEY": ""}
    exe = Path(sys.executable).with_name("grandrounds")
    commands = {"field": [str(exe)] if exe.exists() else [sys.executable, "-m", "grandrounds"],
                "identity": [sys.executable, "-c", IDENTITY]}
    seconds: dict[str, list[float]] = {m: [] for m in commands}
    for i in range(repeats + 1):  # the first round warms the machine cache (not counted)
        for mode, cmd in commands.items():
            db = tmp / f"job-{mode}-{i}.duckdb"
            a = time.perf_counter()
            subprocess.run(cmd + ["run", str(EXAMPLES), "--db", str(db), "--json"], env=env, check=True,
                           capture_output=True, timeout=900)
            if i:
                seconds[mode].append(time.perf_counter() - a)
    field, identity = statistics.median(seconds["field"]), statistics.median(seconds["identity"])
    return {"repeats": repeats, "field_s": round(field, 2), "identity_s": round(identity, 2),
            "ratio": round(field / identity, 3), "runs_s": {m: [round(x, 2) for x in xs] for m, xs in seconds.items()}}


def as_table(r: dict) -> dict:
    """The results file docs/benchmarks.md and docs/patient-data.md render (scripts/bench_docs.py)."""
    hits = {(h["policy"], h["stream"]): h for h in r["hits"]}
    phi = sorted({h["stream"] for h in r["hits"]})
    streams = list(dict.fromkeys(x["stream"] for x in r["retention"]))
    rows = []
    for policy in POLICIES:
        by = {x["stream"]: x for x in r["retention"] if x["policy"] == policy}
        rows.append([policy] + ["not run (the policy has no OSCE mode)" if "unsupported" in by[s] else
                                ("–" if by[s]["kept"] is None else f"{by[s]['kept']:.3f}") +
                                f" ({by[s]['memory_events']} events)" for s in streams]
                    + [str(hits[(policy, s)]["hits"]) for s in phi])
    t, j = r["per_text"], r["job"]
    worst = min((x for x in r["retention"] if x.get("kept") is not None), key=lambda x: x["kept"])
    notes = [
        f"Lowest retention: {worst['policy']} on {worst['stream']} ({worst['kept']:.3f}); the words it lost most "
        f"often: {', '.join(worst['most_lost']) or 'none'}.",
        f"Milliseconds a text ({t['texts']} case texts): cold p50 {t['cold_p50_ms']:.1f} (the tool), from the machine "
        f"cache p50 {t['machine_cache_p50_ms']:.3f} (a new process), from the process memo p50 {t['memo_p50_ms']:.4f}."
        .replace("p50 0.0000", "p50 under 0.0001"),
        f"The README main job, warm, median of {j['repeats']} runs each, alternating: {j['field_s']:.2f} s with the "
        f"field de-identifier, {j['identity_s']:.2f} s with the identity in its place: {j['ratio']:.2f}×.",
        f"De-identifier: {r['tool']['tool']} {r['tool']['tool_version']}, rules version {r['tool']['rules_version']}, "
        f"configuration digest {r['tool']['config_digest'][:16]}…; sim backbone (its accuracy is not a clinical "
        f"measure, and none is shown).",
    ]
    return {
        "title": "Stored memory under the field de-identifier, per policy",
        "about": ("Content words of every memory event that the stored event still holds, on identifier-free "
                  "streams (events written by the policy), and identifiers of one patient found in another "
                  "patient's events or in any memory event, on the authored free-text PHI streams (the third and "
                  "the held-out eponyms authored blind: tests/fixtures/HELDOUT.md); pattern set 4, each "
                  "policy's defaults."),
        "source": ("python benchmarks/bench_deidentify_memory.py --sample 30 --repeats 5 "
                   "--json benchmarks/results/deidentify_memory.json"),
        "columns": ["policy", *[f"kept: {s}" for s in streams], *[f"hits: {Path(s).name}" for s in phi]],
        "rows": rows,
        "notes": notes,
        "raw": r,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=30, help="questions and cases taken from each shared-data set")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of the README main job in each mode")
    ap.add_argument("--json", default=None, help="write the results file here too")
    args = ap.parse_args()
    at = provenance.measured()  # before the run: the build measured, whatever happens to the tree meanwhile
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ["GRANDROUNDS_EMBEDDING_CACHE"] = str(tmp / "memory-cache")
        retention, hits = memory(tmp, args.sample)
        texts = []
        for path, extra in identifier_free_streams(tmp, args.sample).values():
            if not extra:
                texts += [case_text(json.loads(x)) for x in path.read_text().splitlines() if x.strip()]
        timing = per_text(list(dict.fromkeys(texts)), tmp / "text-cache")
        result = {"tool": tool.settings(), "retention": retention, "hits": hits, "per_text": timing,
                  "job": job(tmp, args.repeats), "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps({k: v for k, v in result.items() if k not in ("retention", "hits")}, indent=2))
    if args.json:
        provenance.write_results(args.json, {**as_table(result), "measured": at})


if __name__ == "__main__":
    main()
