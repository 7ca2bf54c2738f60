"""Backbones and environments are found through registries (issue 31, item 4): built-ins listed in code,
third parties through the `grandrounds.backbones` / `grandrounds.environments` entry points.

A third-party backbone installed as a real distribution (a dist-info on sys.path) is used by a run, and
verify re-executes that run from its recorded exchanges without calling it; a name already taken, by a
built-in or by another entry point, is refused naming both; a broken entry point is named and stops only
the runs that ask for it."""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

import pytest
from pydantic import BaseModel

from grandrounds.app import run_cases
from grandrounds.handlers.backbones import RECORDED_BACKBONES, BackboneUnavailable, make_backbone
from grandrounds.handlers.backbones.registry import BackboneRegistration, is_recorded, known_backbones
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.environments import registry as envs
from grandrounds.handlers.plugins import RegistryError
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.runs import RunSpec
from grandrounds.store.embeddings import EmbeddingCache
from grandrounds.store.eventstore import EventStore
from llm_helpers import HashEmbedder

ROOT = Path(__file__).resolve().parents[1]

VENDOR_MODULE = '''
"""A third party's backbone: its model is an in-process function, its replies recorded exchanges."""
from grandrounds.handlers.backbones.agent import build_agent_backbone
from grandrounds.handlers.backbones.registry import BackboneRegistration

CALLS = []


def model(case, memory):
    CALLS.append(case.case_id)
    return sorted(case.options)[len(CALLS) % len(case.options)]


def build(name, model_name, *, recorded=None, live_fallthrough=False, **_ignored):
    return build_agent_backbone(name, model_name, agent=model, recorded=recorded, live_fallthrough=live_fallthrough)


registration = BackboneRegistration(build, recorded=True)
'''


def install(tmp: Path, dist: str, module: str, source: str, entry_points: str) -> Path:
    """A distribution as pip would leave it: the module and its dist-info (METADATA, entry_points.txt)."""
    (tmp / f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    info = tmp / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points), encoding="utf-8")
    return tmp


@pytest.fixture
def vendor(tmp_path, monkeypatch):
    root = install(tmp_path, "vendor_backbone", "vendor_backbone", VENDOR_MODULE,
                   "[grandrounds.backbones]\nvendor = vendor_backbone:registration\n")
    monkeypatch.syspath_prepend(str(root))
    yield
    sys.modules.pop("vendor_backbone", None)


def fake_entry_points(monkeypatch, *eps: tuple[str, str, str]):
    """importlib.metadata.entry_points answering with these (name, value, group) entry points."""
    made = [importlib.metadata.EntryPoint(name, value, group) for name, value, group in eps]

    def entry_points(**select):
        return importlib.metadata.EntryPoints(made).select(**select)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_the_built_ins_are_registered_in_code():
    assert known_backbones() == ["sim", "openai", "record", "agent"]
    assert list(RECORDED_BACKBONES) == ["openai", "record", "agent"]
    assert "sim" not in RECORDED_BACKBONES and "openai" in RECORDED_BACKBONES
    assert envs.known_environments() == ["medagentbench", "agentclinic"]
    assert set(envs.case_kinds()) == {"fhir", "osce"}
    ref = {"path": "/nowhere", "sha256": "0" * 64}
    fhir = envs.record_from_meta({"funcs": ref})  # recorded before records named their environment
    assert type(fhir).__name__ == "EnvironmentRecord" and fhir.name == "medagentbench"
    osce = envs.record_from_meta({"name": "agentclinic", "cases": ref, "max_turns": 3})
    assert type(osce).__name__ == "OsceEnvironmentRecord"
    from grandrounds.replay.order_replay import MODEL_BACKBONES as replayed
    from grandrounds.replay.verify import MODEL_BACKBONES as verified

    assert list(verified) == list(replayed) == ["openai", "record", "agent"]


def test_a_third_party_backbone_runs_and_verify_replays_it_from_the_record(vendor, tmp_path):
    from grandrounds.replay.verify import MODEL_BACKBONES, verify_run

    assert "vendor" in known_backbones() and is_recorded("vendor") and "vendor" in MODEL_BACKBONES
    import vendor_backbone

    cases = load_cases(ROOT / "examples" / "cases.jsonl")[0][:5]
    spec = RunSpec(policy=EvoMedAgentPolicy(memory_min_subjects=1), backbone="vendor", model="vendor-model-1",
                   source="registries")
    db = tmp_path / "vendor.duckdb"
    with EventStore(db) as store:
        outcome = run_cases(store, cases, spec, run_id="v", cache=EmbeddingCache(HashEmbedder(), store.conn))
        assert outcome.processed_now == 5
        started = store.read("v", upto_seq=0)[0]
        assert started.payload["backbone"] == "vendor"
        assert len(list(store.iter("v", types=["llm.exchange"]))) == 5  # the replies are recorded exchanges
    assert len(vendor_backbone.CALLS) == 5
    with EventStore(db, read_only=True) as store:
        result = verify_run(store, "v", EmbeddingCache(HashEmbedder(), store.conn))
    result = result.to_dict()
    assert result["identical"] and result["ok"] and result["replayed_from_record"], result
    assert len(vendor_backbone.CALLS) == 5  # served from the record: the vendor's model was not called again


def test_a_registered_backbone_can_be_chosen_by_name(vendor):
    from grandrounds.backbone_choice import choose_backbone

    choice = choose_backbone("vendor", "vendor-model-1", None, None, False, 7)
    assert (choice.name, choice.model) == ("vendor", "vendor-model-1")
    with pytest.raises(BackboneUnavailable, match=r"available: sim, openai, record, vendor"):
        choose_backbone("nope", None, None, None, False, 7)


def test_an_entry_point_cannot_replace_a_built_in(monkeypatch):
    fake_entry_points(monkeypatch, ("sim", "evil_pkg:registration", "grandrounds.backbones"))
    with pytest.raises(RegistryError,
                       match=r"entry point 'sim' = 'evil_pkg:registration'.*already registered \(built-in\)"):
        make_backbone("sim")
    fake_entry_points(monkeypatch, ("agentclinic", "evil_pkg:env", "grandrounds.environments"))
    with pytest.raises(RegistryError, match=r"entry point 'agentclinic'.*already registered \(built-in\)"):
        envs.known_environments()


def test_two_entry_points_of_one_name_are_refused(monkeypatch):
    fake_entry_points(monkeypatch, ("vendor", "pkg_a:registration", "grandrounds.backbones"),
                      ("vendor", "pkg_b:registration", "grandrounds.backbones"))
    with pytest.raises(RegistryError) as info:
        known_backbones()
    assert "pkg_a:registration" in str(info.value) and "pkg_b:registration" in str(info.value)


def test_a_broken_entry_point_is_named_and_stops_only_its_own_runs(monkeypatch):
    fake_entry_points(monkeypatch, ("broken", "no_such_vendor_module:registration", "grandrounds.backbones"),
                      ("wrongtype", "grandrounds.handlers.backbones.sim:SimBackbone", "grandrounds.backbones"))
    with pytest.raises(RegistryError, match=r"entry point 'broken' = 'no_such_vendor_module:registration'.*"
                                            r"cannot be loaded \(ModuleNotFoundError"):
        make_backbone("broken")
    with pytest.raises(RegistryError, match=r"entry point 'wrongtype'.*names a type, not a .*BackboneRegistration"):
        make_backbone("wrongtype")
    with pytest.raises(RegistryError, match="'broken'"):
        "broken" in RECORDED_BACKBONES  # whether its replies are recorded is in the module that fails
    assert make_backbone("sim").name == "sim"  # the built-ins still work
    with pytest.raises(BackboneUnavailable, match=r"unknown backbone 'nope' \(available: sim, openai, record, agent, "
                                                  r"broken, wrongtype\)"):
        make_backbone("nope")


class ToyRecord(BaseModel):
    name: str = "toy"
    size: int


@contextmanager
def open_toy(record: ToyRecord):
    yield f"toy environment of size {record.size}"


TOY = envs.EnvironmentRegistration(record=ToyRecord, open=open_toy, case_kind="toy", case=ToyRecord)


def test_a_third_party_environment_is_rebuilt_from_its_record(monkeypatch):
    fake_entry_points(monkeypatch, ("toy", f"{__name__}:TOY", "grandrounds.environments"))
    assert envs.known_environments() == ["medagentbench", "agentclinic", "toy"]
    record = envs.record_from_meta({"name": "toy", "size": 3})
    assert isinstance(record, ToyRecord)
    with envs.open_recorded(record) as env:
        assert env == "toy environment of size 3"
    assert envs.case_kinds()["toy"] is TOY
    # a record of an environment nobody registered names it
    with pytest.raises(RegistryError, match=r"environment 'gone', which is not registered here"):
        envs.record_from_meta({"name": "gone"})


def test_the_command_line_runs_and_verifies_a_registered_backbone(vendor, tmp_path):
    """`grandrounds run --backbone vendor` (a plugin's name, not one of click's choices), then `verify`."""
    import json

    from click.testing import CliRunner

    from grandrounds.cli import main

    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join((ROOT / "examples" / "cases.jsonl").read_text().splitlines(keepends=True)[:3]))
    db = tmp_path / "cli.duckdb"
    res = CliRunner().invoke(main, ["run", str(cases), "--db", str(db), "--backbone", "vendor", "--model", "vm",
                                    "--json"])
    assert res.exit_code == 0, res.output
    run_id = json.loads([ln for ln in res.output.splitlines() if ln.startswith("{")][-1])["run_id"]
    res = CliRunner().invoke(main, ["verify", "--db", str(db), run_id, "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["replayed_from_record"], res.output
    res = CliRunner().invoke(main, ["run", str(cases), "--db", str(tmp_path / "x.duckdb"), "--backbone", "nope"])
    assert res.exit_code == 2 and "unknown backbone 'nope' (available: sim, openai, record, vendor)" in res.output
    assert not (tmp_path / "x.duckdb").exists()
