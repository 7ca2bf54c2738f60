"""The field de-identifier (handlers/field_deidentifier.py) on its own: what it keeps, what it removes, its cost.

    python benchmarks/bench_deidentify.py [--sample N] [--json benchmarks/results/deidentify.json]

Issue 41 part 4 in its first form, before the tool is wired into memory: one text at a time, no memory.
- **Content-word retention** on identifier-free texts: `examples/cases.jsonl` (questions and options),
  and from the shared data (`../shared/data`, skipped when absent) ChestAgentBench questions and
  AgentClinic MedQA patient scripts (an evenly spaced sample of N each). A content word is a token of two
  or more letters or digits that is no English stopword (handlers/text.py); retention is the share of
  their occurrences the de-identified text still holds, word for word in order. Beside it: the k-subjects
  word rule (`memory_min_subjects = 3`, handlers/subject_gate.py) on the same texts as one stream, one
  subject a text, as the memory of today's presets applies it.
- **Identifiers removed** on the authored free-text PHI stream (tests/fixtures/freetext_identifiers.jsonl,
  34 cases of 12 patients, and its truth file): an occurrence of a patient's identifier in their own case's
  text that the de-identified text no longer holds is removed.
- **Milliseconds a text**, p50 and p90: cold (the first time the process sees the text; the tool's filters
  loaded before) and cached (the same text again).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT / "benchmarks"))
import provenance  # noqa: E402

from grandrounds.handlers import field_deidentifier as tool  # noqa: E402
from grandrounds.handlers.subject_gate import WITHHELD, SubjectCounts, gate_text  # noqa: E402
from grandrounds.handlers.text import STOPWORDS  # noqa: E402

WORD = re.compile(r"[^\W_]+")
PLACEHOLDER = re.compile(r"\[(?:NAME|PLACE|DATE|AGE 90\+|ID|CONTACT)\]|" + re.escape(WITHHELD))


def content_words(text: str) -> list[str]:
    return [w for w in WORD.findall(PLACEHOLDER.sub(" ", text).lower()) if len(w) >= 2 and w not in STOPWORDS]


def kept_share(original: str, redacted: str) -> tuple[int, int]:
    """(content-word occurrences of `original` that `redacted` still holds, all of them): a multiset
    count, so a word removed once of twice counts once."""
    words = content_words(original)
    left: dict[str, int] = {}
    for w in content_words(redacted):
        left[w] = left.get(w, 0) + 1
    kept = 0
    for w in words:
        if left.get(w, 0) > 0:
            left[w] -= 1
            kept += 1
    return kept, len(words)


def _sample(items: list, n: int) -> list:
    if len(items) <= n:
        return items
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def identifier_free_sets(sample: int) -> dict[str, list[str]]:
    sets: dict[str, list[str]] = {}
    ex = [json.loads(line) for line in (ROOT / "examples" / "cases.jsonl").read_text().splitlines() if line.strip()]
    sets["examples/cases.jsonl"] = [c["question"] + "\n" + "\n".join(f"{k}) {v}" for k, v in c.get("options", {}).items())
                                    for c in ex]
    chest = DATA / "chestagentbench_evomedagent" / "real_cases.json"
    if chest.exists():
        sets["ChestAgentBench questions"] = _sample([c["question"] for c in json.loads(chest.read_text())], sample)
    medqa = DATA / "agentclinic" / "agentclinic_medqa.jsonl"
    if medqa.exists():
        scripts = []
        for line in medqa.read_text().splitlines():
            if line.strip():
                actor = json.loads(line)["OSCE_Examination"]["Patient_Actor"]
                scripts.append("\n".join(_strings(actor)))
        sets["AgentClinic MedQA patient scripts"] = _sample(scripts, sample)
    return sets


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def word_rule(texts: list[str], k: int = 3) -> list[str]:
    """The k-subjects rule over the texts as one stream, a subject each (what today's memory applies)."""
    counts = SubjectCounts(k)
    cases = [{"case_id": f"t{i}", "question": t} for i, t in enumerate(texts)]
    for i, case in enumerate(cases):
        counts.add(case, i)
    return [gate_text(t, counts.withheld(case, i))[0] for i, (t, case) in enumerate(zip(texts, cases))]


def retention(sets: dict[str, list[str]]) -> list[dict]:
    rows = []
    for name, texts in sets.items():
        tool_kept = tool_all = rule_kept = 0
        removed: dict[str, int] = {}
        for text, gated in zip(texts, word_rule(texts)):
            k, n = kept_share(text, tool.redact(text))
            tool_kept, tool_all = tool_kept + k, tool_all + n
            rule_kept += kept_share(text, gated)[0]
            for f in tool.find(text):
                for w in content_words(f.text):
                    removed[w] = removed.get(w, 0) + 1
        top = sorted(removed.items(), key=lambda kv: (-kv[1], kv[0]))[:12]
        rows.append({"texts": name, "n": len(texts), "content_words": tool_all,
                     "kept_field_tool": round(tool_kept / tool_all, 4),
                     "kept_word_rule_k3": round(rule_kept / tool_all, 4),
                     "most_removed": [w for w, _ in top]})
    return rows


PHI_STREAMS = ("freetext_identifiers", "freetext_identifiers_2")
"""The authored free-text PHI streams of tests/fixtures/, each with its truth file."""


def identifiers(stream: str) -> dict:
    fixture = ROOT / "tests" / "fixtures" / f"{stream}.jsonl"
    truth_doc = json.loads((ROOT / "tests" / "fixtures" / f"{stream}.truth.json").read_text())
    truth = {p: list(ns) + list(truth_doc.get("ages_over_89", {}).get(p, [])) for p, ns in truth_doc["patients"].items()}
    found = removed = 0
    left: list[str] = []
    for line in fixture.read_text().splitlines():
        if not line.strip():
            continue
        case = json.loads(line)
        text = "\n".join(_strings({k: v for k, v in case.items() if k in ("question", "context")}))
        redacted = tool.redact(text)
        for needle in truth.get(case.get("subject"), []):
            pat = re.compile(r"(?<![^\W_])" + re.escape(needle) + r"(?![^\W_])", re.I)
            n = len(pat.findall(text))
            found += n
            still = len(pat.findall(redacted))
            removed += n - still
            if still:
                left.append(f"{case['case_id']}: {needle}")
    return {"stream": f"tests/fixtures/{stream}.jsonl", "occurrences": found, "removed": removed, "left": left}


def timing(texts: list[str]) -> dict:
    tool._tool()  # (the filters load once, 0.5-4 s: not a text's cost)
    cold, cached = [], []
    for t in texts:
        a = time.perf_counter()
        tool.find(t)
        cold.append((time.perf_counter() - a) * 1000)
    for t in texts:
        a = time.perf_counter()
        tool.find(t)
        cached.append((time.perf_counter() - a) * 1000)

    def q(xs, p):
        return round(statistics.quantiles(xs, n=100)[p - 1], 3) if len(xs) > 1 else round(xs[0], 3)

    return {"texts": len(texts), "cold_p50_ms": q(cold, 50), "cold_p90_ms": q(cold, 90),
            "cached_p50_ms": q(cached, 50), "cached_p90_ms": q(cached, 90)}


def as_table(r: dict) -> dict:
    """The results file docs/benchmarks.md renders (scripts/bench_docs.py), the raw figures under "raw"."""
    rows = [[x["texts"], x["n"], x["content_words"], f"{x['kept_field_tool']:.3f}", f"{x['kept_word_rule_k3']:.3f}",
             ", ".join(x["most_removed"][:8])] for x in r["retention"]]
    t = r["timing"]
    notes = [f"Identifiers removed from their own case's text, {i['stream']}: {i['removed']} of {i['occurrences']} "
             f"occurrences" + (f" (left: {', '.join(i['left'])})" if i["left"] else "") for i in r["identifiers"]]
    notes.append(f"Milliseconds a text ({t['texts']} texts): cold p50 {t['cold_p50_ms']:.1f}, p90 {t['cold_p90_ms']:.1f}; "
                 f"cached p50 {t['cached_p50_ms']:.3f}. The tool's filters load once a process "
                 f"({r['load_seconds']:.1f} s here).")
    notes.append(f"Tool: {r['tool']['tool']} {r['tool']['tool_version']}, rules version {r['tool']['rules_version']}, "
                 f"configuration digest {r['tool']['config_digest'][:16]}….")
    return {
        "title": "The field de-identifier on one text at a time",
        "about": ("Content words (tokens of 2+ letters or digits, stopwords excluded) of identifier-free texts "
                  "that the de-identified text still holds: handlers/field_deidentifier.py (philter-lite with "
                  "the Safe Harbor rules it lacks) beside the k-subjects word rule at k = 3 (the texts as one "
                  "stream, a subject each). One text at a time, not yet stored memory: memory adds the k-subjects evidence for the words the tool flags but cannot place (pattern sets 3 and 4)."),
        "source": "python benchmarks/bench_deidentify.py --sample 300 --json benchmarks/results/deidentify.json",
        "columns": ["texts", "n", "content words", "kept, field tool", "kept, word rule k=3",
                    "the field tool removed most often"],
        "rows": rows,
        "notes": notes,
        "raw": r,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sample", type=int, default=300, help="texts taken from each shared-data set")
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args()
    at = provenance.measured()  # before the run: the build measured, whatever happens to the tree meanwhile
    started = time.perf_counter()
    sets = identifier_free_sets(args.sample)
    os.environ["GRANDROUNDS_EMBEDDING_CACHE"] = "off"  # one process's own reads: the machine cache is the other benchmark's
    loading = time.perf_counter()
    tool._tool()
    load_seconds = time.perf_counter() - loading
    timed = timing([t for texts in sets.values() for t in texts])  # first: every text is cold here
    result = {"tool": tool.settings(), "retention": retention(sets),
              "identifiers": [identifiers(s) for s in PHI_STREAMS], "timing": timed,
              "load_seconds": round(load_seconds, 2), "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(result, indent=2))
    if args.json:
        provenance.write_results(args.json, {**as_table(result), "measured": at})


if __name__ == "__main__":
    main()
