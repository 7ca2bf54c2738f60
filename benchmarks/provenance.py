"""Where and when a results file was measured: the `measured` entry every benchmarks/results/*.json holds.

A figure on a docs page is rendered from a results file (scripts/bench_docs.py), and the page says the
commit and date it was measured at, so a reader can tell a figure of an older build from one of the code
they run. A script that writes a results file calls `measured()` and stores it under "measured";
`write_results` writes the file atomically (an interrupted benchmark never leaves half a file).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def measured(note: str | None = None) -> dict:
    """{"commit", "date", "changes"[, "note"]}: HEAD's short hash, today's UTC date, and whether the
    working tree had uncommitted changes to tracked code (then the figures are of HEAD plus the change
    that commits this file)."""
    try:
        commit = _git("rev-parse", "--short=7", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results",
                          ":!docs", ":!README.md"))
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", True
    out = {"commit": commit, "date": _dt.datetime.now(_dt.timezone.utc).date().isoformat(), "changes": dirty}
    if note:
        out["note"] = note
    return out


def measured_line(doc: dict, where: str) -> str:
    """'Measured on DATE at commit C.' from a results document's `measured` entry, which it must hold."""
    m = doc.get("measured") if isinstance(doc, dict) else None
    if not isinstance(m, dict) or not m.get("commit") or not m.get("date"):
        raise SystemExit(f'{where}: no "measured": {{"commit", "date"}} (benchmarks/provenance.py measured())')
    line = f"Measured on {m['date']} at commit `{m['commit']}`"
    if m.get("changes"):
        line += " with the change that records this file"
    line += "."
    if m.get("note"):
        note = m["note"].rstrip(".")
        line += " " + note[:1].upper() + note[1:] + "."
    return line


def write_results(path: str | os.PathLike, doc: dict) -> None:
    """`doc` as indented JSON at `path`, atomically (a temporary file beside it, then a rename)."""
    path = Path(path)
    if "measured" not in doc:
        raise ValueError(f"{path}: a results file records where it was measured (benchmarks/provenance.py)")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
