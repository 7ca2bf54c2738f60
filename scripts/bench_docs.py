"""Render every measured figure of the docs from the recorded results in benchmarks/results/.

    python scripts/bench_docs.py           # rewrite the blocks in README.md and docs/*.md
    python scripts/bench_docs.py --check   # exit 1 (and show a diff) if a page differs from the results

Each results file `benchmarks/results/NAME.json` owns one block, between `<!-- bench:NAME -->`
(underscores in NAME written as `-`) and the next `<!-- /bench -->`. docs/benchmarks.md holds every
block; any other page (README.md, docs/*.md) may show a block again, rendered from the same file. Nobody
types a figure into a page: a new measurement is a new results file (or an edited row in one), then this
script; scripts/docs_figures.py fails CI on a figure typed outside a block.

Every results file records where it was measured, `"measured": {"commit", "date", "changes"[, "note"]}`
(benchmarks/provenance.py writes it), and its block says so: a figure of an older build than the code a
page describes reads as one.

Two shapes of results file:
- `real_model.json`, written by `benchmarks/bench_real_model.py --json` (rows of runs plus `meta`), rendered
  by that script's own `render_block`;
- every other file: `{"title", "about", "source", "columns": [...], "rows": [[...], ...], "notes": [...]}`,
  rendered as a paragraph, a table and its notes.
A results file without its block on docs/benchmarks.md, a block on any page without its results file, or
a results file without `measured` is an error.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import measured_line  # noqa: E402  (benchmarks/ is not a package)

RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
"""The page that holds every block."""


def pages() -> list[Path]:
    """Every page that may show a block: the README and the docs site's pages, the benchmark page first."""
    return [PAGE, ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p != PAGE)]

END = "<!-- /bench -->"
_BLOCK = re.compile(r"<!-- bench:([a-z0-9-]+) -->")


def _bench_real_model():
    spec = importlib.util.spec_from_file_location("bench_real_model", ROOT / "benchmarks" / "bench_real_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_table(doc: dict, name: str) -> str:
    """One generic results document as Markdown, markers included."""
    for key in ("title", "columns", "rows"):
        if key not in doc:
            raise SystemExit(f"benchmarks/results/{name}.json: no {key!r}")
    cols = doc["columns"]
    lines = [f"<!-- bench:{name.replace('_', '-')} -->", f"**{doc['title']}.**"]
    if doc.get("about"):
        lines[-1] += " " + doc["about"]
    lines += ["", "| " + " | ".join(_cell(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for i, row in enumerate(doc["rows"]):
        if len(row) != len(cols):
            raise SystemExit(f"benchmarks/results/{name}.json: row {i} has {len(row)} cells, {len(cols)} columns")
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    notes = list(doc.get("notes", []))
    if doc.get("source"):
        notes.append(f"Source: {doc['source']}.")
    notes.append(measured_line(doc, f"benchmarks/results/{name}.json"))
    if notes:
        lines.append("")
        lines += [f"- {n}" for n in notes]
    lines.append(END)
    return "\n".join(lines)


def blocks(results: Path = RESULTS) -> dict[str, str]:
    """marker name → rendered block, one per results file."""
    out = {}
    for path in sorted(results.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        name = path.stem.replace("_", "-")
        if path.stem == "real_model":
            out[name] = _bench_real_model().render_block(doc)
        else:
            out[name] = render_table(doc, path.stem)
    return out


def updated(text: str, rendered: dict[str, str], every: bool = True, page: Path = PAGE) -> str:
    """`text` with each block re-rendered; `every`: the page must hold a block for each results file."""
    on_page = _BLOCK.findall(text)
    missing = sorted(set(rendered) - set(on_page)) if every else []
    orphan = sorted(set(on_page) - set(rendered))
    if missing or orphan:
        raise SystemExit(f"{page.name}: blocks without a results file {orphan}, "
                         f"results files without a block {missing}")
    for name, block in rendered.items():
        if name not in on_page:
            continue
        begin = f"<!-- bench:{name} -->"
        start = text.index(begin)
        stop = text.index(END, start) + len(END)
        text = text[:start] + block + text[stop:]
    return text


def main(argv: list[str] | None = None, page: Path = PAGE, results: Path = RESULTS) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page differs from the results files")
    args = ap.parse_args(argv)
    rendered = blocks(results)
    status = 0
    for i, p in enumerate(pages() if page == PAGE else [page]):  # (a test's own page: that page only)
        old = p.read_text(encoding="utf-8")
        if i and not _BLOCK.search(old):
            continue
        new = updated(old, rendered, every=i == 0, page=p)
        if args.check:
            if new != old:
                sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                           str(p.name), f"{p.name} (from the results)"))
                status = 1
            else:
                print(f"{p.name}: benchmark figures are the recorded results")
            continue
        if new != old:
            tmp = p.with_suffix(".md.tmp")
            tmp.write_text(new, encoding="utf-8")
            os.replace(tmp, p)  # atomic: an interrupted run never leaves half a page
        print(f"{p.name}: figures {'rendered' if new != old else 'already current'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
