"""Fuzzing the case format: every input is either accepted or refused as bad input naming the file
and line (`CaseFileError`, which the CLI maps to exit 2), never another exception. In-process (no
subprocess per input) so the 10,000+ generated inputs stay fast; one CLI check shows the mapping."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grandrounds.cli import main
from grandrounds.handlers.cases import Case, CaseFileError, parse_case_text
from grandrounds.store.canonical import content_hash

PATH = "fuzz.jsonl"
def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])

VALID = {"case_id": "c1", "kind": "mcq", "question": "Which?", "options": {"A": "one", "B": "two"},
         "answer": "A", "category": "cardiology"}
FIELDS = [*VALID, "tools", "extra"]

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)


def _check(data: bytes) -> None:
    try:
        cases, digest = parse_case_text(data, PATH)
    except CaseFileError as exc:
        text = str(exc)
        assert text.startswith(PATH), text
        if exc.line is not None:
            assert text.startswith(f"{PATH}:{exc.line}:") and exc.line >= 1
            # lines as text mode counts them (\r\n, \r and \n end a line; nothing else does)
            assert exc.line <= data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").count(b"\n") + 1
        return
    assert cases and len(digest) == 64
    for case in cases:  # an accepted case must be usable everywhere a case goes: hashed into events
        assert isinstance(case, Case)
        content_hash(case.model_dump(mode="json")).encode("utf-8")
        content_hash(case.view().model_dump(mode="json"))


def _lines(*objs) -> bytes:
    return "\n".join(o if isinstance(o, str) else json.dumps(o, ensure_ascii=False) for o in objs).encode("utf-8")


@pytest.mark.slow
@fuzz(3000)
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data):
    _check(data)


@pytest.mark.slow
@fuzz(2500)
@given(st.lists(st.text(max_size=80), min_size=1, max_size=4))
def test_arbitrary_text_lines(lines):
    _check("\n".join(lines).encode("utf-8", "surrogatepass"))


@pytest.mark.slow
@fuzz(2500)
@given(st.lists(st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8), min_size=1, max_size=3))
def test_objects_with_case_fields_and_any_values(objs):
    _check(_lines(*objs))


@pytest.mark.slow
@fuzz(2500)
@given(st.lists(st.tuples(st.sampled_from(FIELDS), json_values | st.sampled_from([None, "", "Z", "a", "AB"]),
                          st.booleans()), max_size=4),
       st.sampled_from(["", "\r", " ", "\u2028", "\u0085", "\x0c"]),
       st.integers(min_value=0, max_value=3))
def test_mutations_of_a_valid_case(edits, line_end, blank_lines):
    case = dict(VALID)
    for field, value, drop in edits:
        if drop:
            case.pop(field, None)
        else:
            case[field] = value
    _check(_lines(*([""] * blank_lines), case, dict(VALID, case_id="c2")).replace(b"\n", line_end.encode() + b"\n"))


def test_edge_inputs_that_used_to_escape_as_other_errors():
    for data in (b"[" * 100_000, b'{"case_id": ' + b"9" * 5000 + b"}", json.dumps(dict(VALID, question="\ud800 x")).encode(),
                 _lines(dict(VALID, question="a\u2028b")), b"\xff\xfe{}", "\ufeff".encode() + _lines(VALID)):
        _check(data)
    # JSON allows U+2028 inside a string: the case is accepted, on line 1.
    assert parse_case_text(_lines(dict(VALID, question="a\u2028b")), PATH)[0][0].question == "a\u2028b"


def test_the_cli_maps_refused_input_to_exit_2_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(_lines(VALID, "[" * 50_000))
    res = CliRunner().invoke(main, ["run", str(bad), "--db", str(tmp_path / "x.duckdb"), "--json"])
    assert res.exit_code == 2 and f"{bad}:2" in json.loads(res.stdout)["error"]
    assert not (tmp_path / "x.duckdb").exists()
