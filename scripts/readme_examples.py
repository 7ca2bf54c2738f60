"""Regenerate (or check) the README's and the docs pages' example outputs from what the code prints now.

    python scripts/readme_examples.py           # rewrite the blocks in README.md and docs/*.md
    python scripts/readme_examples.py --check   # exit 1 and show a diff if any of them is stale

Each example is a fenced block between `<!-- example:NAME -->` and `<!-- /example -->` in
README.md (which must hold every example: it is the tour) or in a docs page (any of them; each
example is run once and written wherever it appears).
The commands run in a scratch folder; what depends on the machine (the scratch path,
worker count, seconds) is normalised, so the text is the same on any machine. Fingerprints,
accuracies and counts are printed as the code computes them: a change of event bytes shows here.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CASES = ROOT / "examples" / "cases.jsonl"

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
}

_NORMALISE = [
    (re.compile(r"executed\s+(\d+) cases in [\d.]+ s \([\d.]+ cases/s\)"), r"executed   \1 cases in … s"),
    (re.compile(r"· \d+ worker\(s\)"), "· N worker(s)"),
    # The chain covers the stored bytes, and sealed content is encrypted with the new key file's random keys:
    # the chain head differs from one new database to the next (the fingerprint, over the plaintext, does not).
    (re.compile(r"chain head   v(\d+):[0-9a-f]{64}"), r"chain head   v\1:… (depends on the key file's random keys)"),
]


def grandrounds() -> list[str]:
    exe = Path(sys.executable).with_name("grandrounds")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "grandrounds"]


def render(name: str, workdir: Path) -> str:
    out = ""
    env = {**os.environ, "COLUMNS": "120", "OPENAI_BASE_URL": "", "OPENAI_API_KEY": ""}
    for args in EXAMPLES[name]:
        proc = subprocess.run(grandrounds() + args, cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"example {name}: `grandrounds {' '.join(args)}` exited {proc.returncode}:\n"
                             f"{proc.stderr[-2000:]}")
        out = proc.stdout
    for pattern, repl in _NORMALISE:
        out = pattern.sub(repl, out)
    for scratch in {str(workdir.resolve()), str(workdir)}:  # files the commands name (the key file) are in it
        out = out.replace(scratch + os.sep, "")
    return out.replace(str(CASES), "examples/cases.jsonl").rstrip() + "\n"


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- example:{name} -->\n```\n)(.*?)(```\n<!-- /example -->)", re.S)


def pages() -> list[Path]:
    """README.md, then every docs page holding an example block."""
    return [README] + [p for p in sorted(DOCS.glob("*.md")) if "<!-- example:" in p.read_text(encoding="utf-8")]


def updated(texts: dict[Path, str]) -> dict[Path, str]:
    """Each page's text with its example blocks replaced by what the code prints now."""
    for name in EXAMPLES:
        if not _block(name).search(texts[README]):
            raise SystemExit(f"README.md has no block <!-- example:{name} --> … <!-- /example -->")
    for path, text in texts.items():
        for name in re.findall(r"<!-- example:([a-z0-9-]+) -->", text):
            if name not in EXAMPLES:
                raise SystemExit(f"{path.relative_to(ROOT)}: no example named {name!r} in scripts/readme_examples.py")
    out = dict(texts)
    with tempfile.TemporaryDirectory(prefix="gr-readme-") as tmp:
        for name in EXAMPLES:
            body = render(name, Path(tmp))
            for path in out:
                out[path] = _block(name).sub(lambda m: m.group(1) + body + m.group(3), out[path])
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
