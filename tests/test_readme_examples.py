"""The example outputs of the README's tour and of the docs pages are what the code prints now
(scripts/readme_examples.py runs each example's commands: run, replay, verify, audit explain).

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
