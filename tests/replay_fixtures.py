"""Fixtures shared by the replay, verify, audit and export tests.

One database file per test session holds the recorded runs every test reads: `src` (the
first 40 example cases, evo-medagent, sim), `teach` (a seven-case stream built so that memory
changes later answers: a rule taught by one case answers a later one, another rule is
patched, demoted twice and retired) and `teach-none` (the same stream without memory).
Tests that write get their own copy of the file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from grandrounds.app import run_cases
from grandrounds.handlers.cases import Case, load_cases
from grandrounds.handlers.policies.config import EvoMedAgentPolicy, NoMemoryPolicy
from grandrounds.handlers.runs import RunSpec
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.eventstore import EventStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "cases.jsonl"
SOURCE_CASES = 40


def _case(cid: str, question: str, options: list[str], gold: str, category: str) -> Case:
    letters = "ABC"
    return Case(case_id=cid, kind="mcq", question=question, options=dict(zip(letters, options)),
                answer=letters[options.index(gold)], category=category)


def teaching_cases() -> list[Case]:
    """teach-1 teaches 'Aortic dissection'; learn-1 (same presentation, options reordered, and a
    word that sends lexical matching to the wrong option) is answered from that rule. kd-1 teaches
    a rule that kd-2 patches, kd-3 and kd-4 demote, and kd-5 retires."""
    kd = "Fever, conjunctivitis, strawberry tongue, cervical lymphadenopathy, desquamation of fingertips and coronary aneurysm in a toddler."
    return [
        _case("teach-1", "Sudden tearing chest pain radiating to the back, unequal arm blood pressures, widened "
              "mediastinum; pulmonary vessels normal.",
              ["Acute myocardial infarction", "Aortic dissection", "Pulmonary embolism"], "Aortic dissection", "cardiology"),
        _case("kd-1", kd, ["Measles", "Kawasaki disease", "Scarlet fever"], "Kawasaki disease", "pediatrics"),
        _case("learn-1", "Tearing chest pain radiating to the back with unequal arm blood pressures and a widened "
              "mediastinum on pulmonary imaging.",
              ["Aortic dissection", "Pulmonary embolism", "Acute pericarditis"], "Aortic dissection", "cardiology"),
        _case("kd-2", kd, ["Kawasaki disease", "Toxic shock syndrome", "Measles"], "Toxic shock syndrome", "pediatrics"),
        _case("kd-3", "Fever, conjunctivitis, strawberry tongue and a sandpaper rash after pharyngitis in a schoolchild.",
              ["Toxic shock syndrome", "Scarlet fever", "Measles"], "Scarlet fever", "pediatrics"),
        _case("kd-4", "Fever, conjunctivitis, cervical lymphadenopathy in an adolescent.",
              ["Toxic shock syndrome", "Adenovirus infection", "Measles"], "Adenovirus infection", "pediatrics"),
        _case("kd-5", "Fever, conjunctivitis, strawberry tongue, cervical swelling in an infant.",
              ["Toxic shock syndrome", "Rheumatic fever", "Measles"], "Rheumatic fever", "pediatrics"),
    ]


_BUILT: dict[str, Path] = {}  # module globals outlive test modules: one build per session


def _build(directory: Path) -> Path:
    path = directory / "recorded.duckdb"
    cases = load_cases(EXAMPLES)[0][:SOURCE_CASES]
    with EventStore(path) as store:
        cache = EmbeddingCache(shared_minilm(), store.conn)
        run_cases(store, cases, RunSpec(policy=EvoMedAgentPolicy(), source="examples-40"), run_id="src", cache=cache)
        teach = teaching_cases()
        # The teaching stream is a rule's whole life in a few cases of few patients: without the k-subjects gate
        # (memory_min_subjects=1; its own tests are tests/test_privacy_freetext.py), which would withhold its words.
        run_cases(store, teach, RunSpec(policy=EvoMedAgentPolicy(memory_min_subjects=1), source="teaching"),
                  run_id="teach", cache=cache)
        run_cases(store, teach, RunSpec(policy=NoMemoryPolicy(), source="teaching"), run_id="teach-none", cache=cache)
    return path


@pytest.fixture(scope="session")
def recorded_db(tmp_path_factory) -> Path:
    """The pristine recorded file (read it; copy it before writing)."""
    if "db" not in _BUILT:
        _BUILT["db"] = _build(tmp_path_factory.mktemp("recorded"))
    return _BUILT["db"]


@pytest.fixture
def db_copy(recorded_db, tmp_path) -> Path:
    """A private, writable copy of the recorded file."""
    target = tmp_path / "work.duckdb"
    shutil.copyfile(recorded_db, target)
    keys = Path(str(recorded_db) + ".keys")  # its sealed content opens with the key file beside it
    if keys.exists():
        shutil.copyfile(keys, str(target) + ".keys")
    return target
