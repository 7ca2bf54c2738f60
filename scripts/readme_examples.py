"""Regenerate (or check) the README's example outputs from what the code prints now.

    python scripts/readme_examples.py           # rewrite the blocks in README.md
    python scripts/readme_examples.py --check   # exit 1 and show a diff if README.md is stale

Each example is a fenced block between `<!-- example:NAME -->` and `<!-- /example -->` in
README.md. The commands run in a scratch folder; what depends on the machine (the scratch path,
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
CASES = ROOT / "examples" / "cases.jsonl"

# name → (commands run in order; the output shown is the last one's)
EXAMPLES: dict[str, list[list[str]]] = {
    "run": [["run", str(CASES), "--db", "grandrounds.duckdb"]],
    "replay": [["run", str(CASES), "--db", "runs.duckdb", "--run-id", "ex"],
               ["replay", "--db", "runs.duckdb", "--from", "ex", "--permutations", "5", "--seed", "0",
                "--plot", "curves.png", "--report", "report.html"]],
}

_NORMALISE = [
    (re.compile(r"executed\s+(\d+) cases in [\d.]+ s \([\d.]+ cases/s\)"), r"executed   \1 cases in … s"),
    (re.compile(r"· \d+ worker\(s\)"), "· N worker(s)"),
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
    return out.replace(str(CASES), "examples/cases.jsonl").rstrip() + "\n"


def updated_readme(text: str) -> str:
    with tempfile.TemporaryDirectory(prefix="gr-readme-") as tmp:
        for name in EXAMPLES:
            block = re.compile(rf"(<!-- example:{name} -->\n```\n)(.*?)(```\n<!-- /example -->)", re.S)
            if not block.search(text):
                raise SystemExit(f"README.md has no block <!-- example:{name} --> … <!-- /example -->")
            body = render(name, Path(tmp))
            text = block.sub(lambda m: m.group(1) + body + m.group(3), text, count=1)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md differs from what the code prints")
    args = ap.parse_args()
    old = README.read_text(encoding="utf-8")
    new = updated_readme(old)
    if args.check:
        if new != old:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                       "README.md", "README.md (code now)"))
            return 1
        print("README examples are current")
        return 0
    if new != old:
        tmp = README.with_suffix(".md.tmp")
        tmp.write_text(new, encoding="utf-8")
        os.replace(tmp, README)  # atomic: an interrupted run never leaves half a README
    print("README examples regenerated" if new != old else "README examples already current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
