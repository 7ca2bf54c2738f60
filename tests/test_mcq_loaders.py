"""MCQ loaders against the real benchmark files (skipped where ../shared/data is absent)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from grandrounds.cli import main
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.environments.mcq_loaders import chest_case, load_agentclinic_nejm, load_chestagentbench, nejm_case

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CHEST = DATA / "chestagentbench_evomedagent" / "real_cases.json"
NEJM = DATA / "agentclinic" / "agentclinic_nejm_extended.jsonl"
NEJM15 = DATA / "agentclinic" / "agentclinic_nejm.jsonl"
needs = lambda p: pytest.mark.skipif(not p.exists(), reason=f"benchmark data absent: {p} (../shared/data is not part of the repo)")  # noqa: E731


def test_chest_item_parsing_never_reads_the_descriptor():
    item = {"question": "Which finding is shown in Figure 1?\nA) Pneumothorax\nB) Effusion\nwith loculation\nC) Nodule",
            "ground_truth": "B) Effusion with loculation", "category": "detection",
            "case_descriptor": "LEAK-SENTINEL effusion", "case_id": "1"}
    case = chest_case(item, "cab-1-q1")
    assert case.options == {"A": "Pneumothorax", "B": "Effusion with loculation", "C": "Nodule"}
    assert case.answer == "B" and case.question == "Which finding is shown in Figure 1?"
    assert "LEAK-SENTINEL" not in case.model_dump_json()


def test_nejm_item_accepts_string_flags_and_needs_one_correct():
    answers = [{"text": t, "correct": "True" if t == "Gout" else "False"} for t in ("RA", "Gout", "OA", "SLE", "PsA")]
    case = nejm_case({"question": "Diagnosis?", "answers": answers, "image_url": "https://x"}, "nejm-001")
    assert case.answer == "B" and list(case.options) == list("ABCDE") and "https://x" not in case.model_dump_json()
    with pytest.raises(ValueError, match="2 answers marked correct"):
        nejm_case({"question": "?", "answers": [{"text": "a", "correct": True}, {"text": "b", "correct": True}]}, "x")


@needs(CHEST)
def test_chestagentbench_real_file():
    cases = load_chestagentbench(CHEST)
    items = json.loads(CHEST.read_text())
    assert len(cases) == 2500 and len({c.case_id for c in cases}) == 2500
    assert Counter(c.category for c in cases) == {"classification": 1024, "detection": 972, "localization": 504}
    assert Counter(len(c.options) for c in cases) == {6: 2460, 5: 40}
    for item, case in zip(items, cases):
        assert item["ground_truth"].startswith(case.answer)
        assert item["case_descriptor"] not in case.model_dump_json()


@needs(NEJM)
def test_agentclinic_nejm_real_files():
    cases = load_agentclinic_nejm(NEJM)
    assert len(cases) == 120 and all(len(c.options) == 5 for c in cases)
    assert {c.answer for c in cases} <= set("ABCDE")
    assert len(load_agentclinic_nejm(NEJM15)) == 15


@needs(CHEST)
def test_convert_command_writes_runnable_cases(tmp_path):
    out = tmp_path / "cab.jsonl"
    res = CliRunner().invoke(main, ["convert", str(CHEST), "--format", "chestagentbench", "-o", str(out),
                                    "--limit", "25", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["cases"] == 25
    cases, _ = load_cases(out)
    assert len(cases) == 25 and cases[0].case_id.startswith("cab-")


def test_convert_bad_input_exits_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"question": "Q?\nA) x\nB) y", "ground_truth": "Z) none", "case_id": "1"}]))
    res = CliRunner().invoke(main, ["convert", str(bad), "--format", "chestagentbench", "-o", str(tmp_path / "o"),
                                    "--json"])
    assert res.exit_code == 2 and "not an option" in res.stdout
