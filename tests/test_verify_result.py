"""`VerifyResult` (issue 31, item 1): one frozen value for whatever `verify_run` found, whose `to_dict()` is the
`verify --json` object key for key and in order (the re-executed shape and the not-re-executable one), and
`verify_runs` for several runs of one file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from grandrounds.app import make_cache, run_cases
from grandrounds.cli import main
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.policies.config import EvoMedAgentPolicy, NoMemoryPolicy
from grandrounds.handlers.runs import RunSpec
from grandrounds.replay.caselog import UnknownRun
from grandrounds.replay.verify import REASON_ORDER, AnchorCheck, Divergence, VerifyResult, verify_run, verify_runs
from grandrounds.store.eventstore import EventStore
from grandrounds.store.signing import HeadCheck

ROOT = Path(__file__).resolve().parents[1]

# The `verify --json` keys, in order, as the CLI, HTTP, MCP and the Python API have always sent them.
REEXECUTED_KEYS = ["run_id", "fingerprint", "replayed_fingerprint", "identical", "events", "cases", "complete",
                   "completeness", "declared_cases", "completed_cases", "backbone", "replayed_from_record",
                   "first_divergence", "chain_intact", "chain_break_seq", "chain_version", "chain_head",
                   "signed_head", "code_versions", "warnings", "reasons", "reason_codes", "reason", "ok"]
NOT_REEXECUTED_KEYS = ["run_id", "fingerprint", "replayed_fingerprint", "identical", "events", "cases",
                       "erased_cases", "unreadable_seqs", "reexecutable", "complete", "completeness",
                       "declared_cases", "completed_cases", "backbone", "replayed_from_record", "first_divergence",
                       "chain_intact", "chain_break_seq", "chain_version", "chain_head", "signed_head",
                       "warnings", "reasons", "reason_codes", "reason", "ok"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("verify_result") / "runs.duckdb"
    cases = load_cases(ROOT / "examples" / "cases.jsonl")[0][:3]
    with EventStore(path) as store:
        cache = make_cache(store)
        run_cases(store, cases, RunSpec(policy=EvoMedAgentPolicy(), source="vr"), run_id="a", cache=cache)
        run_cases(store, cases, RunSpec(policy=NoMemoryPolicy(), source="vr"), run_id="b", cache=cache)
    return path


def _result(**changes) -> VerifyResult:
    """A result built by hand (no store): the not-re-executable shape unless told otherwise."""
    fields = dict(run_id="r", fingerprint="f" * 64, replayed_fingerprint=None, identical=False, events=12, cases=2,
                  complete=True, completeness="all 2 declared cases completed, run.completed present",
                  declared_cases=2, completed_cases=2, backbone="sim", replayed_from_record=False,
                  first_divergence=None, chain_break_seq=None, chain_version=2, chain_head="v2:" + "c" * 64,
                  signed_head=HeadCheck("not checked", None, "no key"), reexecutable=False,
                  reasons=("the content of 1 case(s) was erased",), reason_codes=("erased",),
                  erased_cases=("c1",), unreadable_seqs={"erased": [3]})
    return VerifyResult(**{**fields, **changes})


def test_to_dict_is_the_cli_json_object_key_for_key(two_runs):
    with EventStore(two_runs, read_only=True) as store:
        result = verify_run(store, "a", make_cache(store), expect="0" * 64)
    res = CliRunner().invoke(main, ["verify", "--db", str(two_runs), "a", "--json", "--expect", "0" * 64])
    assert res.exit_code == 1, res.output  # the published fingerprint differs
    cli = json.loads(res.stdout)
    assert cli.pop("db") == str(two_runs)
    # The same object in the same key order (json.loads keeps it); `expect` stands where the anchors always did.
    assert json.dumps(result.to_dict()) == json.dumps(cli)
    assert list(cli) == REEXECUTED_KEYS[:18] + ["expect"] + REEXECUTED_KEYS[18:]
    assert result.identical and not result.ok and result.reason == "expect_mismatch"
    assert result.expect == AnchorCheck("0" * 64, result.fingerprint, False)


def test_a_result_without_anchors_has_exactly_the_documented_keys(two_runs):
    with EventStore(two_runs, read_only=True) as store:
        result = verify_run(store, "b", make_cache(store))
    out = result.to_dict()
    assert list(out) == REEXECUTED_KEYS
    assert result.ok and out["ok"] is True and out["reason"] is None and out["reason_codes"] == []
    assert out["signed_head"] == result.signed_head.as_dict() and out["chain_intact"] is result.chain_intact
    json.dumps(out)  # plain JSON values only: tuples became lists, the head and divergence dicts


def test_the_not_re_executable_shape_puts_the_content_problems_after_the_counts():
    out = _result().to_dict()
    assert list(out) == NOT_REEXECUTED_KEYS
    assert out["erased_cases"] == ["c1"] and out["unreadable_seqs"] == {"erased": [3]}
    assert out["reexecutable"] is False and out["ok"] is False and out["reason"] == "erased"


def test_a_run_not_re_executed_is_never_ok_even_without_a_reason():
    assert not _result(reasons=(), reason_codes=()).ok
    assert _result(reasons=(), reason_codes=(), reexecutable=True).ok


def test_reason_is_the_most_telling_code_not_the_first_added():
    later, earlier = REASON_ORDER[-1], REASON_ORDER[0]
    result = _result(reasons=("x", "y"), reason_codes=(later, earlier))
    assert result.reason == earlier and result.to_dict()["reason_codes"] == [later, earlier]


def test_reasons_and_codes_must_pair_up():
    with pytest.raises(ValueError):
        _result(reasons=("one",), reason_codes=())
    with pytest.raises(ValueError):
        _result(reasons=("one",), reason_codes=("not-a-code",))


def test_the_result_is_frozen_and_its_divergence_is_clipped_only_in_the_dict():
    long = "x" * 400
    d = Divergence(7, "c1", "answer.given", "answer.given", "payload.text", long, "y")
    result = _result(first_divergence=d, reexecutable=True, code_versions={"recorded": None, "build": {},
                                                                           "differences": []})
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.ok = True  # type: ignore[misc]
    assert result.first_divergence.recorded == long
    assert result.to_dict()["first_divergence"]["recorded"] == "x" * 300 + "…"


def test_verify_runs_verifies_each_run_in_order_with_a_cache_of_its_own(two_runs):
    made = []

    def factory(store):
        made.append(store)
        return make_cache(store)

    with EventStore(two_runs, read_only=True) as store:
        results = verify_runs(store, ["b", "a"], factory)
        assert made == []  # lazy: nothing re-executed before a result is asked for
        got = list(results)
        assert len(made) == 2 and all(s is store for s in made)
        assert [r.run_id for r in got] == ["b", "a"] and all(r.ok for r in got)
        alone = verify_run(store, "a", make_cache(store))
    assert got[1] == alone
    assert got[0].fingerprint != got[1].fingerprint


def test_verify_runs_raises_for_a_run_the_file_does_not_hold(two_runs):
    with EventStore(two_runs, read_only=True) as store:
        results = verify_runs(store, ["a", "nope"], make_cache)
        assert next(results).ok
        with pytest.raises(UnknownRun):
            next(results)


def test_verify_all_checks_every_run_of_the_file(two_runs, tmp_path):
    res = CliRunner().invoke(main, ["verify", "--db", str(two_runs), "--all", "--json"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert [(r["run_id"], r["ok"], r["identical"]) for r in lines] == [("a", True, True), ("b", True, True)]
    # the same object as verifying the run alone
    alone = json.loads(CliRunner().invoke(main, ["verify", "--db", str(two_runs), "b", "--json"]).stdout)
    assert lines[1] == alone


@pytest.mark.parametrize("args, said", [([], "give one RUN or --all"), (["a", "--all"], "give one RUN or --all"),
                                        (["--all", "--expect", "0" * 64], "give RUN, not --all")])
def test_verify_needs_one_run_or_all_and_no_anchor_with_all(two_runs, args, said):
    res = CliRunner().invoke(main, ["verify", "--db", str(two_runs), *args])
    assert res.exit_code == 2 and said in res.output, res.output


def test_verify_all_of_a_file_without_runs_is_bad_input(tmp_path):
    empty = tmp_path / "empty.duckdb"
    EventStore(empty).close()
    res = CliRunner().invoke(main, ["verify", "--db", str(empty), "--all"])
    assert res.exit_code == 2 and "holds no runs" in res.output, res.output
