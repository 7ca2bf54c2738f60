"""No measured figure is typed into a page: each sits in a block a script renders (scripts/docs_figures.py).

Figures come from benchmarks/results/ (scripts/bench_docs.py) or from the commands themselves
(scripts/readme_examples.py); both scripts' --check run in tests/test_readme_bench.py and
tests/test_readme_examples.py. This test is the other half: outside those blocks, a figure-like token
stands only where the reviewed allow-list cites its source.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _figures():
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "scripts" / "docs_figures.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["docs_figures"] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def _tree(tmp_path: Path, readme: str, page: str) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(readme, encoding="utf-8")
    (tmp_path / "docs" / "page.md").write_text(page, encoding="utf-8")
    return tmp_path


def test_no_figure_is_typed_outside_a_generated_block():
    assert _figures().main([]) == 0


@pytest.mark.parametrize("figure", ["0.756", "23/28", "4.9 ms", "43 MB", "1,500 cases/s", "1.18×", "×1.1",
                                    "1.54x", "95 %", "1.5 s", "12 µs"])
def test_a_typed_figure_is_caught(tmp_path, figure):
    root = _tree(tmp_path, "# t\n", f"Intro.\n\nIt scored {figure} here.\n")
    hits, unused = _figures().scan(root, [])
    assert [(h.page, h.line, h.token.replace(" ", "")) for h in hits] == [("docs/page.md", 3, figure.replace(" ", ""))]
    assert unused == []


def test_figures_inside_generated_blocks_and_plain_numbers_pass(tmp_path):
    page = ("Run it with `--cases 200` on 2 cores; task 7 of 30 steps.\n\n"
            "<!-- bench:x -->\n| a |\n|---|\n| 0.756 · 23/28 · 4.9 ms |\n<!-- /bench -->\n\n"
            "<!-- example:run -->\n```\naccuracy 59/78 = 0.756\n```\n<!-- /example -->\n")
    hits, _ = _figures().scan(_tree(tmp_path, "# t\n", page), [])
    assert hits == []


def test_the_allow_list_covers_a_cited_phrase_across_a_line_break_and_goes_stale(tmp_path):
    figures = _figures()
    root = _tree(tmp_path, "# t\n", "The target: replay at\n≥ 1,500 cases/s per process. Also 1,500 cases/s.\n")
    entry = {"page": "docs/page.md", "text": "replay at ≥ 1,500 cases/s per process", "source": "design §9"}
    hits, unused = figures.scan(root, [entry])
    assert [h.line for h in hits] == [2] and unused == []  # the second, uncited one is still an error
    stale = {"page": "docs/page.md", "text": "a phrase no page holds 0.5 s", "source": "x"}
    _, unused = figures.scan(root, [entry, stale])
    assert unused == [stale]
    allowed = tmp_path / "allowed.json"
    allowed.write_text(json.dumps([entry, stale]))
    assert figures.main([], root=root, allowed_path=allowed) == 1


def test_every_allow_list_entry_cites_a_source():
    entries = _figures().load_allowed()
    assert entries and all(len(e["source"]) > 10 for e in entries)
