"""The example outputs of the README's tour and of the docs pages are what the code prints now
(scripts/readme_examples.py runs each example's commands: run, replay, verify, audit explain on the tour; verify --json,
erase, the anchors, simulated tools, a missing key file on the docs pages).

A change of event bytes changes the fingerprints shown there; this test fails until the pages are
regenerated with `python scripts/readme_examples.py`, so their examples cannot go stale silently.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_readme_examples_are_what_the_code_prints():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_examples.py"), "--check"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_examples", ROOT / "scripts" / "readme_examples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_example_is_on_a_page_and_the_tour_holds_its_own():
    """An example no page shows, or a tour example the README lacks, is an error (issue 42, part 1)."""
    mod = _script()
    texts = {p: p.read_text(encoding="utf-8") for p in mod.pages()}
    for name in mod.EXAMPLES:
        assert any(mod._block(name).search(t) for t in texts.values()), name
    without = dict(texts)
    page = next(p for p, t in texts.items() if mod._block("erase").search(t))
    without[page] = mod._block("erase").sub("", texts[page])
    with pytest.raises(SystemExit, match="no page holds the example 'erase'"):
        mod.updated(without)
    tour = {**texts, mod.README: mod._block("audit").sub("", texts[mod.README])}
    with pytest.raises(SystemExit, match="README.md has no block <!-- example:audit -->"):
        mod.updated(tour)


def test_an_indented_block_is_filled_indented():
    mod = _script()
    text = "- item:\n\n  <!-- example:anchors -->\n  ```\n  old\n  ```\n  <!-- /example -->\n"
    m = mod._block("anchors").search(text)
    filled = text[:m.start()] + mod._fill(m, "line one\n\nline two\n") + text[m.end():]
    assert "  ```\n  line one\n\n  line two\n  ```\n  <!-- /example -->" in filled and "old" not in filled
