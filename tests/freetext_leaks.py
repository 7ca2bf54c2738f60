"""Counting identifiers that cross patients in a run of tests/fixtures/freetext_identifiers.jsonl.

The fixture's vignettes state their patient in free text (names without honorifics, international phone
numbers and date formats, addresses, record numbers; three patients have four cases each, one patient's
relative is named only in the case's structured `identifiers`). The truth file lists, per patient
(subject), the identifiers a reader would recognise them by. A hit is one such identifier of patient A
found in an event of a case of another patient B (any event type: case input excepted, memory retrieved,
the agent's steps, model exchanges, reflections, memory items), or in a run-level event, or in any
memory-carrying event at all (memory holds no identifier of anyone, its own patient's included).

Run directly for the report (`python tests/freetext_leaks.py [POLICY ...]`): a table of hits and accuracy
per policy, the k-subjects rule on (the default) and off (`memory_min_subjects = 1`, pattern set 1).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "freetext_identifiers.jsonl"
TRUTH = ROOT / "tests" / "fixtures" / "freetext_identifiers.truth.json"
FIXTURE_2 = ROOT / "tests" / "fixtures" / "freetext_identifiers_2.jsonl"
"""A second authored stream (issue 41): names that are English words (Grace Field, Summer Lake, Bill Baker),
relatives' and clinicians' names, rare and non-English places, e-mail, national numbers, written dates,
ages over 89 and phones in several layouts."""

FIXTURE_3 = ROOT / "tests" / "fixtures" / "freetext_identifiers_3.jsonl"
"""A third stream, authored blind (tests/fixtures/HELDOUT.md): a held-out check, never a source of patterns."""
EPONYMS_HELDOUT = ROOT / "tests" / "fixtures" / "clinical_eponyms_heldout.jsonl"
"""Identifier-free vignettes dense in eponyms, authored blind (tests/fixtures/HELDOUT.md)."""

POLICIES = {
    "evo-medagent": 'name = "evo-medagent"\n',
    "skemex": 'name = "skemex"\nwindow = 1\nbuffer_gating = false\n',
    "selsm": 'name = "selsm"\n',
    "retrosum": 'name = "retrosum"\n',
    "precedent": 'name = "precedent"\n',
    "long-context": 'name = "long-context"\n',
}
"""The memory policies; skemex distils every case (window 1, no buffer gating), so it writes skills at all
on a 34-case stream."""

OFF = "memory_min_subjects = 1\ndeidentify_patterns = 1\n"
"""The behaviour before issue 32: no k-subjects rule, the pattern set before the free-text patterns."""


def truth_of(cases: Path) -> Path:
    return cases.with_name(cases.name.removesuffix(".jsonl") + ".truth.json")


def needles(truth: Path = TRUTH) -> dict[str, list[str]]:
    """Per patient, the identifiers a reader would know them by (ages over 89 included)."""
    doc = json.loads(truth.read_text(encoding="utf-8"))
    return {p: ns + doc.get("ages_over_89", {}).get(p, []) for p, ns in doc["patients"].items()}


def _pattern(needle: str) -> re.Pattern[str]:
    return re.compile(r"(?<![^\W_])" + re.escape(needle.lower()) + r"(?![^\W_])")


def count_hits(events, truth: Path = TRUTH) -> dict:
    """Hits in a run's events (`StoredEvent`s, decoded), by kind of place; `pairs`: the (A, B) patient pairs."""
    from grandrounds.store.events import payload_class

    truth = {p: [(n, _pattern(n)) for n in ns] for p, ns in needles(truth).items()}
    subject = {e.case_id: e.payload["case"].get("subject") for e in events if e.type == "case.received"}
    hits: Counter[str] = Counter()
    pairs: set[tuple[str, str]] = set()
    examples: list[str] = []
    for e in events:
        if e.type == "case.received":
            continue  # the case's own input
        text = json.dumps(e.payload, ensure_ascii=False).lower()
        own = subject.get(e.case_id)
        memory = payload_class(e.type).carries_memory
        for patient, ns in truth.items():
            if patient == own and not memory:
                continue  # a case may see its own patient's identifiers (not in memory, though)
            for needle, pat in ns:
                if pat.search(text):
                    where = "memory" if memory else ("run" if e.case_id is None else "other-case")
                    hits[where] += 1
                    if own and patient != own:
                        pairs.add((patient, own))
                    if len(examples) < 8:
                        examples.append(f"{e.type} of {e.case_id} ({own}) holds {needle!r} of {patient}")
    return {"hits": sum(hits.values()), "by_place": dict(hits), "pairs": len(pairs), "examples": examples}


def run_policy(policy: str, db: Path, off: bool = False, cases: Path = FIXTURE, extra: str = "") -> tuple[dict, dict]:
    """(`grandrounds run --json` output, count_hits of its events) for one policy, sim backbone; `extra`:
    more lines of its policy file."""
    from click.testing import CliRunner

    from grandrounds.cli import main
    from grandrounds.store.eventstore import EventStore

    toml = db.parent / f"{policy}{'-off' if off else ''}.toml"
    toml.write_text(POLICIES[policy] + (OFF if off else "") + extra, encoding="utf-8")
    res = CliRunner().invoke(main, ["run", str(cases), "--db", str(db), "--policy", str(toml),
                                    "--backbone", "sim", "--json"])
    lines = [ln for ln in res.output.splitlines() if ln.startswith("{")]
    assert res.exit_code == 0 and lines, res.output
    out = json.loads(lines[-1])
    with EventStore(str(db), read_only=True) as s:
        events = s.read(out["run_id"])
    return out, count_hits(events, truth_of(cases))


def main(argv: list[str]) -> None:
    policies = argv or list(POLICIES)
    print("sim backbone: offline simulator; its accuracy is not a clinical measure")
    print(f"{'policy':14} {'rule':4} {'hits':>5} {'pairs':>5} {'accuracy':>8}  by place")
    with tempfile.TemporaryDirectory() as tmp:
        for policy in policies:
            for off in (True, False):
                out, h = run_policy(policy, Path(tmp) / f"{policy}-{off}.duckdb", off)
                print(f"{policy:14} {'off' if off else 'on':4} {h['hits']:5d} {h['pairs']:5d} {out['accuracy']:8.3f}  "
                      f"{h['by_place']}")
                for x in h["examples"][:3] if off else h["examples"]:
                    print("    " + x)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    main(sys.argv[1:])
