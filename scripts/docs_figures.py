"""Fail when a measured figure is typed into a page instead of rendered from a results file or a command.

    python scripts/docs_figures.py           # list every figure-like token outside a generated block; exit 1 if any
    python scripts/docs_figures.py --stale   # also list allow-list entries that no page holds any more

The pages are README.md and docs/*.md. A figure belongs in a generated block: `<!-- bench:NAME -->`
(scripts/bench_docs.py renders it from benchmarks/results/NAME.json, which records where it was measured)
or `<!-- example:NAME -->` (scripts/readme_examples.py runs the commands and writes what they print).
Outside those, a figure-like token (a three-decimal number, a fraction n/m, a duration in ms or a decimal
of seconds, a size, a rate per second, a ratio with ×, a percentage) is an error unless the reviewed
allow-list, scripts/docs_figures_allowed.json, names it: each entry is a page, a phrase of that page that
holds the token, and the source that makes it a fact rather than a measurement of this code (a paper's
number, a protocol's rule, a design target, a constant of the code, a test's assertion). An entry no page
holds any more is an error too, so the list stays reviewed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = ROOT / "scripts" / "docs_figures_allowed.json"

GENERATED = re.compile(r"<!-- (bench|example):[a-z0-9-]+ -->.*?<!-- /\1 -->", re.S)
"""A block a script writes (its figures are checked by that script's --check, run by the tests)."""

FIGURE = re.compile(r"""(?x)
    (?<![\w.])\d*\.\d{3}(?!\d)                      # a three-decimal accuracy or cosine: 0.756
  | (?<![\w/.-])\d+/\d+(?![\w/])                    # a fraction: 23/28
  | \d+(?:[.,]\d+)*\s?(?:ms|µs|us)\b                # a duration in milliseconds or microseconds
  | \b\d+\.\d+\s?s\b                                # a decimal of seconds: 1.5 s
  | \d+(?:[.,]\d+)*\s?(?:[KMGT]i?B|kB)\b            # a size: 43 MB
  | \d+(?:[.,]\d+)*\s?(?:cases|events|rows|texts|calls|tokens)/s\b   # a rate
  | \d+(?:\.\d+)?\s?×|×\s?\d+(?:\.\d+)?             # a ratio: 1.18×, ×1.1
  | \b\d+(?:\.\d+)?x\b                              # a ratio written with x: 1.54x
  | \d+(?:\.\d+)?\s?%                               # a percentage
""")


@dataclass(frozen=True)
class Hit:
    page: str
    line: int
    token: str
    context: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.token!r} in: {self.context}"


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def outside_blocks(text: str) -> str:
    """`text` with every generated block blanked, its line breaks kept (so line numbers stay)."""
    return GENERATED.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def load_allowed(path: Path = ALLOWED) -> list[dict]:
    entries = json.loads(path.read_text(encoding="utf-8"))
    for i, e in enumerate(entries):
        if not (isinstance(e, dict) and e.get("page") and e.get("text") and e.get("source")):
            raise SystemExit(f"{path.name}: entry {i} needs a page, the text that holds the figure, and its source")
    return entries


def _phrase(text: str) -> re.Pattern:
    """An allowed phrase as a pattern: its spaces match any run of whitespace (it may wrap across lines)."""
    return re.compile(r"\s+".join(re.escape(w) for w in text.split()))


def scan(root: Path = ROOT, allowed: list[dict] | None = None) -> tuple[list[Hit], list[dict]]:
    """(figures outside generated blocks that no allow-list entry covers, allow-list entries never used)."""
    allowed = load_allowed() if allowed is None else allowed
    hits: list[Hit] = []
    used: set[int] = set()
    for path in pages(root):
        rel = path.relative_to(root).as_posix()
        text = outside_blocks(path.read_text(encoding="utf-8"))
        covered: list[tuple[int, int]] = []
        for i, entry in enumerate(allowed):
            if entry["page"] == rel:
                for m in _phrase(entry["text"]).finditer(text):
                    covered.append(m.span())
                    used.add(i)
        lines = text.splitlines()
        for m in FIGURE.finditer(text):
            if any(a <= m.start() and m.end() <= b for a, b in covered):
                continue
            n = text.count("\n", 0, m.start()) + 1
            hits.append(Hit(rel, n, m.group(0), lines[n - 1].strip()[:160]))
    unused = [e for i, e in enumerate(allowed) if i not in used]
    return hits, unused


def main(argv: list[str] | None = None, root: Path = ROOT, allowed_path: Path = ALLOWED) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stale", action="store_true", help="(always checked) list unused allow-list entries")
    ap.parse_args(argv)
    hits, unused = scan(root, load_allowed(allowed_path))
    for h in hits:
        print(h)
    for e in unused:
        print(f"{allowed_path.name}: no longer on {e['page']}: {e['text']!r} (remove the entry)")
    if hits or unused:
        print(f"{len(hits)} figure(s) outside a generated block, {len(unused)} stale allow-list entr(ies): render "
              "figures from benchmarks/results/ (scripts/bench_docs.py), outputs with scripts/readme_examples.py, "
              "or cite the source in scripts/docs_figures_allowed.json", file=sys.stderr)
        return 1
    print(f"docs figures: none typed outside a generated block ({len(pages(root))} pages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
