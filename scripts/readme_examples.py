"""Regenerate (or check) the README's and the docs pages' example outputs from what the code prints now.

    python scripts/readme_examples.py           # rewrite the blocks in README.md and docs/*.md
    python scripts/readme_examples.py --check   # exit 1 and show a diff if any of them is stale

Each example is a fenced block between `<!-- example:NAME -->` and `<!-- /example -->` in
README.md (which must hold every example of `README_EXAMPLES`: it is the tour) or in a docs page
(any of them; each example is run once and written wherever it appears; an example that no page
holds is an error). Every page that shows what a command prints shows it through such a block.
The commands run in a scratch folder; what depends on the machine (the scratch path,
worker count, seconds) is normalised, so the text is the same on any machine. Fingerprints,
accuracies and counts are printed as the code computes them: a change of event bytes shows here.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CASES = ROOT / "examples" / "cases.jsonl"
TRAIN = ROOT / "examples" / "recurring_train.jsonl"
TEST = ROOT / "examples" / "recurring_test.jsonl"

# name → (commands run in order; the output shown is the last one's)
EXAMPLES: dict[str, list[list[str]]] = {
    "run": [["run", str(CASES), "--db", "grandrounds.duckdb"]],
    "replay": [["run", str(CASES), "--db", "runs.duckdb", "--run-id", "ex"],
               ["replay", "--db", "runs.duckdb", "--from", "ex", "--permutations", "5", "--seed", "0",
                "--plot", "curves.png", "--report", "report.html"]],
    "verify": [["run", str(CASES), "--db", "runs.duckdb", "--run-id", "ex"],
               ["verify", "--db", "runs.duckdb", "ex"]],
    "audit": [["run", str(CASES), "--db", "runs.duckdb", "--run-id", "ex"],
              ["audit", "explain", "ex", "ex-056", "--db", "runs.duckdb"]],
    # docs pages only
    "verify-json": [["run", str(CASES), "--db", "runs.duckdb", "--run-id", "ex"],
                    ["verify", "--db", "runs.duckdb", "ex", "--json"]],
    "anchors": [["run", str(CASES), "--db", "anchors.duckdb"]],
    "erase": [["run", str(CASES), "--db", "erase.duckdb", "--run-id", "er"],
              ["erase", "--db", "erase.duckdb", "--subject", "case:ex-001"]],
    "erase-verify": [["run", str(CASES), "--db", "erased.duckdb", "--run-id", "er"],
                     ["erase", "--db", "erased.duckdb", "--subject", "case:ex-001"],
                     ["verify", "--db", "erased.duckdb", "er"]],
    "sim-tools": [["run", str(CASES), "--db", "tools.duckdb", "--run-id", "tl", "--sim-tool", "ddx-lookup=0.95",
                   "--sim-tool", "triage-score=0.1"]],
    "tool-history": [["run", str(CASES), "--db", "tools.duckdb", "--run-id", "tl", "--sim-tool", "ddx-lookup=0.95",
                      "--sim-tool", "triage-score=0.1"],
                     ["audit", "history", "tl", "ddx-lookup", "--db", "tools.duckdb"]],
    "key-missing": [["run", str(CASES), "--db", "runs.duckdb", "--run-id", "ex"],
                    ["!copy", "runs.duckdb", "copy.duckdb"],  # the database without its key file
                    ["verify", "--db", "copy.duckdb", "ex"]],
    "offline-frozen": [["run", str(TRAIN), "--db", "offline.duckdb", "--run-id", "train"],
                       ["run", str(TEST), "--db", "offline.duckdb", "--run-id", "test", "--memory-from", "train"]],
    "offline-empty": [["run", str(TEST), "--db", "offline-empty.duckdb", "--run-id", "test"]],
    "offline-none": [["run", str(TEST), "--db", "offline-none.duckdb", "--run-id", "test", "--policy", "none"]],
    "policies-sim": [["run", str(CASES), "--db", f"policy-{name}.duckdb", "--run-id", name, "--policy", name]
                     for name in ("evo-medagent", "skemex", "selsm", "retrosum", "precedent", "long-context", "none")],
    "retrosum-ablations": [["run", str(CASES), "--db", f"retrosum-{i}.duckdb", "--run-id", label, "--policy", "retrosum",
                            *[x for a in ablations for x in ("--ablation", a)]]
                           for i, (label, ablations) in enumerate([
                               ("retrosum", []), ("answer-lessons-everywhere", ["answer-lessons-everywhere"]),
                               ("no-actor-lessons", ["no-actor-lessons"]), ("no-writing", ["no-writing"]),
                               ("no-summariser-lessons", ["no-summariser-lessons"])])],
}
"""A step `["!copy", SRC, DST]` copies a file of the scratch folder (no output)."""
README_EXAMPLES = ("run", "replay", "verify", "audit")
"""The examples the README must hold (the tour); the others are shown on docs pages."""
ALL_OUTPUTS = {"policies-sim", "retrosum-ablations"}
"""Examples that show what every command printed, not only the last."""
EXIT_CODES = {"erase-verify": 1, "key-missing": 2}
"""Examples whose last command exits non-zero by design (verify of an erased run: not re-executable)."""
VERIFY_KEYS = ("run_id", "fingerprint", "replayed_fingerprint", "identical", "complete", "completeness",
               "chain_intact", "chain_break_seq", "chain_version", "signed_head", "first_divergence", "warnings",
               "reasons", "ok")


def _verify_json(out: str) -> str:
    """`verify --json`'s object, the keys docs/replay.md explains, one per line (the rest elided)."""
    doc = json.loads(out.strip().splitlines()[-1])
    lines = [f' "{k}": {json.dumps(doc[k])},' for k in VERIFY_KEYS if k in doc]
    return "{\n" + "\n".join(lines) + "\n …}\n"


def _lines(pattern: str):
    return lambda out: "".join(ln + "\n" for ln in out.splitlines() if re.search(pattern, ln))


SHOWN = {"verify-json": _verify_json, "anchors": _lines(r"^\s+(fingerprint|chain head)\b"),
         "sim-tools": _lines(r"^\s+tools\b"), **{f"offline-{k}": _lines(r"^run |^\s+cases\b") for k in
                                                ("frozen", "empty", "none")},
         "policies-sim": _lines(r"^run |^\s+cases\b"), "retrosum-ablations": _lines(r"^run |^\s+cases\b"), "tool-history": _lines(r"^history|^\s+calls|relabelled")}
"""What of an example's output a page shows, where not all of it."""

_NORMALISE = [
    (re.compile(r"executed\s+(\d+) cases in [\d.]+ s \([\d.]+ cases/s\)"), r"executed   \1 cases in … s"),
    (re.compile(r"· \d+ worker\(s\)"), "· N worker(s)"),
    # The chain covers the stored bytes, and sealed content is encrypted with the new key file's random keys:
    # the chain head differs from one new database to the next (the fingerprint, over the plaintext, does not).
    (re.compile(r"chain head   v(\d+):[0-9a-f]{64}"), r"chain head   v\1:… (depends on the key file's random keys)"),
    (re.compile(r'"chain_head": "v(\d+):[0-9a-f]{64}"'), r'"chain_head": "v\1:…"'),
    # a subject's reference is an HMAC under the key file's own random secret
    (re.compile(r"erased subject [0-9a-f]{12}…"), "erased subject …"),
]


def grandrounds() -> list[str]:
    exe = Path(sys.executable).with_name("grandrounds")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "grandrounds"]


def render(name: str, workdir: Path) -> str:
    out = ""
    env = {**os.environ, "COLUMNS": "120", "OPENAI_BASE_URL": "", "OPENAI_API_KEY": ""}
    for args in EXAMPLES[name]:
        if args[0] == "!copy":
            shutil.copyfile(workdir / args[1], workdir / args[2])
            continue
        proc = subprocess.run(grandrounds() + args, cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=1800)
        expected = EXIT_CODES.get(name, 0) if args is EXAMPLES[name][-1] else 0
        if proc.returncode != expected:
            raise SystemExit(f"example {name}: `grandrounds {' '.join(args)}` exited {proc.returncode}:\n"
                             f"{proc.stderr[-2000:]}")
        shown = proc.stdout + (proc.stderr if expected else "")  # a refusal is said on stderr
        out = out + shown if name in ALL_OUTPUTS else shown
    if name in SHOWN:
        out = SHOWN[name](out)
    for pattern, repl in _NORMALISE:
        out = pattern.sub(repl, out)
    for scratch in {str(workdir.resolve()), str(workdir)}:  # files the commands name (the key file) are in it
        out = out.replace(scratch + os.sep, "")
    return out.replace(str(ROOT) + os.sep, "").rstrip() + "\n"


def _block(name: str) -> re.Pattern:
    """An example's block; indented as a whole inside a list item, its output is indented alike."""
    return re.compile(rf"(<!-- example:{name} -->\n( *)```\n)(.*?)(\2```\n *<!-- /example -->)", re.S)


def _fill(m: re.Match, body: str) -> str:
    indent = m.group(2)
    return m.group(1) + "".join(indent + ln if ln.strip() else ln for ln in body.splitlines(True)) + m.group(4)


def pages() -> list[Path]:
    """README.md, then every docs page holding an example block."""
    return [README] + [p for p in sorted(DOCS.glob("*.md")) if "<!-- example:" in p.read_text(encoding="utf-8")]


def updated(texts: dict[Path, str]) -> dict[Path, str]:
    """Each page's text with its example blocks replaced by what the code prints now."""
    for name in README_EXAMPLES:
        if not _block(name).search(texts[README]):
            raise SystemExit(f"README.md has no block <!-- example:{name} --> … <!-- /example -->")
    for name in EXAMPLES:
        if not any(_block(name).search(t) for t in texts.values()):
            raise SystemExit(f"no page holds the example {name!r} (<!-- example:{name} --> … <!-- /example -->)")
    for path, text in texts.items():
        for name in re.findall(r"<!-- example:([a-z0-9-]+) -->", text):
            if name not in EXAMPLES:
                raise SystemExit(f"{path.relative_to(ROOT)}: no example named {name!r} in scripts/readme_examples.py")
    out = dict(texts)
    with tempfile.TemporaryDirectory(prefix="gr-readme-") as tmp:
        for name in EXAMPLES:
            body = render(name, Path(tmp))
            for path in out:
                out[path] = _block(name).sub(lambda m: _fill(m, body), out[path])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a page differs from what the code prints")
    args = ap.parse_args()
    old = {p: p.read_text(encoding="utf-8") for p in pages()}
    new = updated(old)
    stale = [p for p in old if new[p] != old[p]]
    if args.check:
        for p in stale:
            rel = str(p.relative_to(ROOT))
            sys.stdout.writelines(difflib.unified_diff(old[p].splitlines(True), new[p].splitlines(True),
                                                       rel, f"{rel} (code now)"))
        if stale:
            return 1
        print("README and docs examples are current")
        return 0
    for p in stale:
        tmp = p.with_suffix(".md.tmp")
        tmp.write_text(new[p], encoding="utf-8")
        os.replace(tmp, p)  # atomic: an interrupted run never leaves half a page
    print(f"examples regenerated in {', '.join(str(p.relative_to(ROOT)) for p in stale)}" if stale
          else "README and docs examples already current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
