"""The streamed case file (`CaseFile`, what `grandrounds run` reads) against `load_cases` (the whole file
parsed at once): for any bytes, the same cases and source hash, or the same error naming the same line;
and it holds offsets, not parsed cases."""

from __future__ import annotations

import gc
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import grandrounds.handlers.cases as cases_module
from grandrounds.handlers.cases import Case, CaseFile, CaseFileError, open_cases, parse_case_text

VALID = {"kind": "mcq", "question": "Which?", "options": {"A": "one", "B": "two"}, "answer": "A"}


def _case(case_id: str, **extra) -> bytes:
    return json.dumps({"case_id": case_id, **VALID, **extra}, ensure_ascii=False).encode("utf-8")


FRAGMENTS = st.sampled_from([
    _case("a"), _case("b"), _case("c"), _case("a\u2028b"), _case("d", question="\u00e9\u4e2d"), b"", b"   ",
    b"\n", b"\r", b"\r\n", b"\n\n", b"{", b"[1]", b"\xe2\x82", b"\xff", b"\xed\xa0\x80", b"\xc3\xa9",
    _case("e", answer="Z"), b'{"case_id": "x"}', b"\x0c", "\u2028".encode("utf-8"), b"\xef\xbb\xbf",
])


@pytest.fixture
def tiny_chunks(monkeypatch):
    monkeypatch.setattr(cases_module, "_CHUNK", 5)  # line ends, \r\n and UTF-8 sequences split across reads


def _outcome(fn):
    try:
        cases, digest = fn()
    except CaseFileError as exc:
        return "error", str(exc)
    return "ok", [c.model_dump(mode="json") for c in cases], digest


def _same(tmp_path, data: bytes) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(data)
    expected = _outcome(lambda: parse_case_text(data, str(path)))
    assert _outcome(lambda: open_cases(path)) == expected


@settings(max_examples=400, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(FRAGMENTS, st.sampled_from([b"\n", b"\r\n", b"\r", b""])), max_size=12))
def test_same_as_load_cases(tmp_path, tiny_chunks, parts):
    _same(tmp_path, b"".join(a + b for a, b in parts))


@pytest.mark.parametrize("data, where", [
    (_case("a") + b"\n" + _case("b") + b"\n" + _case("a") + b"\n{", ":3: field 'case_id': duplicate"),
    (_case("a") + b"\n{\n" + _case("a"), ":2: not valid JSON"),  # the earlier error wins
    (b"{\n" + _case("a") + b"\n\xff", ":3: not UTF-8"),  # a file that is not UTF-8 is refused first
    (b"\r\r" + _case("a") + b"\r\n\n" + _case("a"), ":5: field 'case_id': duplicate case_id 'a' (first on line 3)"),
    (b"\n \n", "no cases in file"),
])
def test_errors_in_load_cases_order(tmp_path, tiny_chunks, data, where):
    _same(tmp_path, data)
    (tmp_path / "c.jsonl").write_bytes(data)
    with pytest.raises(CaseFileError, match=where.replace("(", r"\(").replace(")", r"\)")):
        open_cases(tmp_path / "c.jsonl")


def test_duplicate_digest_is_checked_on_the_ids(tmp_path, monkeypatch):
    # every id digests alike: the duplicate must still be found on the ids themselves, and none invented
    monkeypatch.setattr(cases_module, "_digest8", lambda data: 7 if data in (b"a", b"b", b"c") else hash(data) & (2 ** 64 - 1))
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\n".join([_case("a"), _case("b"), _case("c")]))
    assert [c.case_id for c in open_cases(path)[0]] == ["a", "b", "c"]
    path.write_bytes(b"\n".join([_case("a"), _case("b"), _case("c"), _case("b")]))
    with pytest.raises(CaseFileError, match=r":4: field 'case_id': duplicate case_id 'b' \(first on line 2\)"):
        open_cases(path)


def test_holds_no_parsed_cases(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\n".join(_case(f"c{i}") for i in range(500)))
    gc.collect()
    before = sum(isinstance(o, Case) for o in gc.get_objects())
    cases, _ = open_cases(path)
    gc.collect()
    assert sum(isinstance(o, Case) for o in gc.get_objects()) - before < 5
    assert len(cases) == 500 and cases[499].case_id == "c499" and cases[-1].case_id == "c499"
    assert [c.case_id for c in cases[2:4]] == ["c2", "c3"]


def test_a_file_changed_after_the_check_is_refused(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(_case("a") + b"\n" + _case("b"))
    cases = CaseFile(path)
    path.write_bytes(_case("a") + b"\n" + _case("z"))  # same length, other content
    assert cases[0].case_id == "a"
    with pytest.raises(CaseFileError, match=r":2: changed since"):
        cases[1]
