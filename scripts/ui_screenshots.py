"""Screenshot every page of the web view (`grandrounds ui`) with a headless Chromium, so a person
can look at them without a browser session.

    python scripts/ui_screenshots.py --db runs.duckdb --run ex [--out ui-shots] [--chromium /usr/bin/chromium]

Pages: the runs list, RUN's overview, one case (--case, default the last case that followed
memory), one memory item (--item, default the item that case followed), memory as of the middle
case, a diff between the middle and the end, and tool governance. Needs Playwright's Python
package and a Chromium binary (Debian: apt-get install chromium); never downloads a browser.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grandrounds.replay.audit_explain import explain
from grandrounds.store.eventstore import EventStore
from grandrounds.ui.pages import case_list
from grandrounds.ui.serve import serving


def pick_pages(db: str, run: str, case: str | None, item: str | None) -> list[tuple[str, str]]:
    with EventStore(db, read_only=True) as store:
        cases = case_list(store, run)
        if case is None:
            from_memory = [c for c in cases if (c["source"] or "").split(":")[0] in ("rule", "episode", "skill")]
            case = (from_memory or cases)[-1]["case_id"]
        if item is None:
            source = explain(store, run, case)["answer_source"] or ""
            item = source.split(":", 1)[1] if ":" in source and not source.startswith("tool:") else None
        mid = len(cases) // 2
    pages = [("runs", "/"), ("run", f"/runs/{run}"), ("case", f"/runs/{run}/cases/{case}")]
    if item:
        pages.append(("item", f"/runs/{run}/items/{item}"))
    pages += [("memory", f"/runs/{run}/memory?case={mid}"), ("diff", f"/runs/{run}/diff?a_case={mid}"),
              ("tools", f"/runs/{run}/tools")]
    return pages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--case")
    ap.add_argument("--item")
    ap.add_argument("--out", default="ui-shots")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--width", type=int, default=1280)
    args = ap.parse_args(argv)
    if not Path(args.chromium).exists():
        print(f"no Chromium at {args.chromium} (apt-get install chromium, or --chromium PATH)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pages = pick_pages(args.db, args.run, args.case, args.item)
    with serving(args.db) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": args.width, "height": 900})
        for name, path in pages:
            resp = page.goto(base + path)
            target = out / f"{name}.png"
            page.screenshot(path=str(target), full_page=True)
            print(f"{resp.status if resp else '?'}  {target}  {path}")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
