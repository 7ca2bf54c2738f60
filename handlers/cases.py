"""Cases: the JSONL input contract, validated line by line with errors that name file, line and field."""

from __future__ import annotations

import hashlib
import json
import re
from array import array
from pathlib import Path
from typing import BinaryIO, Iterator, Literal, Sequence, overload

import numpy as np

from grandrounds.store.errors import InvalidInput

from pydantic import (BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationError, field_validator,
                      model_serializer, model_validator)

from grandrounds.store.canonical import sha256_hex


class CaseView(BaseModel):
    """What the acting agent may see of a case: everything but the gold answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    case_id: str
    kind: Literal["mcq"]
    question: str
    options: dict[str, str]
    category: str
    tools: list[str]


class CaseIdentifiers(BaseModel):
    """Identifiers of the case's patient, as the data holder knows them (optional): every one of them is
    replaced, exactly and case-insensitively, by its typed placeholder in all memory-bound text written
    from the case (handlers/deidentify.py), whatever the patterns and the k-subjects rule would find.
    A name's parts are scrubbed one by one as well ("Eleanor Vasquez-Whitfield": also "Eleanor",
    "Vasquez-Whitfield", "Vasquez", "Whitfield"); an ISO date in `birth_dates` or `dates` in its usual
    spellings too (1950-01-10, 01/10/1950, 10.01.1950, January 10, 1950, ...). Never counted as the
    case's vocabulary, never shown to the agent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    names: tuple[str, ...] = ()
    """The patient's and relatives' names, as written ("Eleanor Vasquez-Whitfield")."""
    mrns: tuple[str, ...] = ()
    """Medical record numbers."""
    ids: tuple[str, ...] = ()
    """Other record, insurance, national or device numbers."""
    birth_dates: tuple[str, ...] = ()
    """Dates of birth (ISO `YYYY-MM-DD` is also scrubbed in its other spellings)."""
    dates: tuple[str, ...] = ()
    """Other dates that identify (admission, discharge, death)."""
    phones: tuple[str, ...] = ()
    emails: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    """Street lines, towns, postcodes: each as its own entry."""

    @field_validator("*")
    @classmethod
    def _non_empty(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for v in values:
            if len(v.strip()) < 2:
                raise ValueError(f"identifier {v!r} is shorter than two characters")
        return values


def _omit_unset(data, *keys: str):
    # Left out while unset, so cases without them keep their bytes (and runs their fingerprints).
    if isinstance(data, dict):
        for key in keys:
            if data.get(key) is None:
                data.pop(key, None)
    return data


class Case(BaseModel):
    """One case of the stream. `answer` is the gold option letter, shown to feedback only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    case_id: str = Field(min_length=1)
    kind: Literal["mcq"]
    question: str = Field(min_length=1)
    options: dict[str, str]
    answer: str
    category: str = Field(default="general", min_length=1)
    tools: list[str] = Field(default_factory=list)
    """Names of simulated tools this case may use; empty means every tool the run offers."""
    subject: str | None = Field(default=None, min_length=1)
    """Whom the case is about (a patient id): its content is sealed under that subject's key and
    `grandrounds erase --subject` erases it. None: the case is its own subject (`case:<case_id>`)."""
    identifiers: CaseIdentifiers | None = None
    """The patient's identifiers, scrubbed exactly from memory written from this case (`CaseIdentifiers`)."""

    @model_serializer(mode="wrap")
    def _omit_unset_subject(self, handler: SerializerFunctionWrapHandler):
        return _omit_unset(handler(self), "subject", "identifiers")

    @field_validator("options")
    @classmethod
    def _letters(cls, options: dict[str, str]) -> dict[str, str]:
        if len(options) < 2:
            raise ValueError("needs at least two options")
        for letter, text in options.items():
            if len(letter) != 1 or not letter.isalpha() or not letter.isupper():
                raise ValueError(f"option key {letter!r} is not a single capital letter")
            if not text.strip():
                raise ValueError(f"option {letter} is empty")
        return dict(sorted(options.items()))

    @model_validator(mode="after")
    def _answer_is_an_option(self) -> "Case":
        if self.answer not in self.options:
            raise ValueError(f"answer {self.answer!r} is not one of the options {sorted(self.options)}")
        return self

    def view(self) -> CaseView:
        return CaseView(case_id=self.case_id, kind=self.kind, question=self.question,
                        options=self.options, category=self.category, tools=self.tools)


class CaseFileError(InvalidInput, ValueError):
    """Bad input: names the file, the 1-based line and the offending field."""

    def __init__(self, path: str, line: int | None, field: str | None, message: str):
        self.path, self.line, self.field, self.message = path, line, field, message
        where = path if line is None else f"{path}:{line}"
        super().__init__(f"{where}: {'field ' + repr(field) + ': ' if field else ''}{message}")


def _field_of(err: dict) -> str:
    loc = [str(p) for p in err.get("loc", ())]
    return ".".join(loc) if loc else "(line)"


def jsonl_lines(text: str) -> list[str]:
    """The lines of a JSONL text: split at \n only (a trailing \r dropped). `str.splitlines` would also
    split at U+2028, U+0085, \x0c ..., which are legal inside JSON strings, and misnumber lines."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        self.key = key
        super().__init__(key)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are all different. Python keeps the last of two equal keys, other readers
    the first: a line `{"case_id": "a", …, "case_id": "b"}` would be one case here and another there
    (an auditor's `jq`, a first-wins parser), so it is refused, not read either way."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return out


def loads_unique(text: str | bytes):
    """`json.loads` that refuses an object with a duplicate key (`_DuplicateKey`, a ValueError)."""
    return json.loads(text, object_pairs_hook=_unique_keys)


def parse_line(raw: str, number: int, path: str) -> Case | None:
    """One line of a case file as a case (None for a blank line), or CaseFileError naming path:number."""
    if not raw.strip():
        return None
    try:
        data = loads_unique(raw)
    except _DuplicateKey as exc:
        raise CaseFileError(path, number, exc.key, f"duplicate key {exc.key!r} in a JSON object: a reader that "
                            "keeps the first and one that keeps the last would see different cases") from None
    except json.JSONDecodeError as exc:
        raise CaseFileError(path, number, None, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise CaseFileError(path, number, None, "not a case: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        raise CaseFileError(path, number, None, f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CaseFileError(path, number, None, "a case must be a JSON object")
    try:
        # Everything a case holds is hashed as UTF-8 later (events, fingerprints): a \ud800-style
        # escape of half a surrogate pair decodes but cannot be encoded, so refuse it here.
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise CaseFileError(path, number, None, "contains an unpaired surrogate escape (\\ud800-\\udfff)") from None
    except (RecursionError, ValueError):
        raise CaseFileError(path, number, None, "not a case: JSON nested too deeply") from None
    try:
        return Case.model_validate(data)
    except RecursionError:
        raise CaseFileError(path, number, None, "not a case: JSON nested too deeply") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        raise CaseFileError(path, number, _field_of(err), msg) from None


def duplicate_error(path: str, number: int, case_id: str, first: int) -> CaseFileError:
    return CaseFileError(path, number, "case_id", f"duplicate case_id {case_id!r} (first on line {first})")


def parse_cases(lines: list[str], path: str) -> list[Case]:
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        case = parse_line(raw, number, path)
        if case is None:
            continue
        if case.case_id in seen:
            raise duplicate_error(path, number, case.case_id, seen[case.case_id])
        seen[case.case_id] = number
        cases.append(case)
    if not cases:
        raise CaseFileError(path, None, None, "no cases in file")
    return cases


def load_cases(path: str | Path) -> tuple[list[Case], str]:
    """All cases of a JSONL file, validated before anything runs, and the file's sha256."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise CaseFileError(str(path), None, None, "file not found") from None
    except IsADirectoryError:
        raise CaseFileError(str(path), None, None, "is a directory, not a case file") from None
    return parse_case_text(data, str(path))


def parse_case_text(data: bytes, path: str) -> tuple[list[Case], str]:
    """`load_cases` on the bytes of a file named `path` (in messages): the cases and the bytes' sha256
    as UTF-8 text. Raises CaseFileError (bad input, naming path and line) and nothing else."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise CaseFileError(path, line, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    # Newlines as text mode reads them (\r\n and \r become \n), so the file's hash, which names
    # the run's source, is what it was when files were read with Path.read_text.
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return parse_cases(jsonl_lines(text), path), sha256_hex(text)


_LINE_END = re.compile(rb"\r\n|\r|\n")
_CHUNK = 1 << 20


def _raw_lines(f: BinaryIO) -> Iterator[tuple[int, bytes, bytes]]:
    """(byte offset, line without its end, the end) of each line of a binary file, split where text mode
    splits (\r\n, \r, \n), read a chunk at a time. The last line has an empty end (and may be empty)."""
    buf, base = b"", 0
    while True:
        chunk = f.read(_CHUNK)
        eof = not chunk
        buf += chunk
        pos = 0
        for m in _LINE_END.finditer(buf):
            if not eof and m.end() == len(buf) and m.group() == b"\r":
                break  # maybe the first half of a \r\n split between chunks
            yield base + pos, buf[pos:m.start()], m.group()
            pos = m.end()
        buf, base = buf[pos:], base + pos
        if eof:
            yield base, buf, b""
            return


def _digest8(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class CaseFile(Sequence[Case]):
    """The cases of a JSONL file without holding them: checked whole when opened, read back one at a time.

    Opening makes one streaming pass that does what `load_cases` does (the same checks, in the same
    order, the same errors naming file and line, the same source hash) but keeps, per case, only where
    its line is (offset, length, line number) and an 8-byte digest of the line: 32 bytes a case instead
    of the parsed case (~3 KB), so a 100k-case file costs ~3 MB, not ~300 MB. `cases[i]` reads line i
    again, checks its digest (a file changed since it was checked is refused, never run) and parses
    it. Duplicate ids are found from 8-byte digests of the ids (confirmed on the ids themselves)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._offsets, self._lengths = array("q"), array("q")
        self._numbers, self._digests = array("q"), array("Q")
        self._fh: BinaryIO | None = None
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise CaseFileError(self.path, None, None, "file not found") from None
        except IsADirectoryError:
            raise CaseFileError(self.path, None, None, "is a directory, not a case file") from None
        with f:
            self.source = self._scan(f)

    def _scan(self, f: BinaryIO) -> str:
        path, hasher, ids = self.path, hashlib.sha256(), array("Q")
        newlines, number, error = 0, 0, None
        for offset, line, end in _raw_lines(f):
            number += 1
            try:
                # decoded with its end, so an error's reason is the one decoding the whole file gives
                text = (line + end).decode("utf-8")
            except UnicodeDecodeError as exc:
                # every line is decoded, even after a bad one: load_cases refuses a file that is not
                # UTF-8 before it parses any line, and so does this
                raise CaseFileError(path, newlines + 1, None,
                                    f"not UTF-8 text ({exc.reason} at byte {offset + exc.start})") from None
            newlines += end.count(b"\n")
            hasher.update(line + b"\n" if end else line)  # the text with every line end made \n
            if error is not None:
                continue
            try:
                case = parse_line(text[:len(text) - len(end)], number, path)
            except CaseFileError as exc:
                error = exc
                continue
            if case is None:
                continue
            self._offsets.append(offset)
            self._lengths.append(len(line))
            self._numbers.append(number)
            self._digests.append(_digest8(line))
            ids.append(_digest8(case.case_id.encode("utf-8")))
        duplicate = self._first_duplicate(ids)
        if duplicate is not None:  # on a line before any other error, as load_cases reports it
            raise duplicate
        if error is not None:
            raise error
        if not self._offsets:
            raise CaseFileError(path, None, None, "no cases in file")
        return hasher.hexdigest()

    def _first_duplicate(self, ids: array) -> CaseFileError | None:
        """The error load_cases raises for the first case whose id an earlier case had, if any."""
        if len(ids) < 2:
            return None
        h = np.frombuffer(ids, dtype=np.uint64)
        order = np.argsort(h, kind="stable")  # equal digests keep file order: the first is the original
        ranked = h[order]
        same = ranked[1:] == ranked[:-1]
        if not same.any():
            return None
        starts = np.concatenate(([True], ~same))  # where each run of equal digests begins
        first_of = order[np.maximum.accumulate(np.where(starts, np.arange(len(h)), 0))]
        later = np.flatnonzero(~starts)  # every repeat, by rank
        index = int(order[later].min())
        first = int(first_of[later[np.argmin(order[later])]])
        case, original = self[index], self[first]
        if case.case_id != original.case_id:  # two ids share a digest (~1e-10 at 100k cases): check exactly
            return self._exact_duplicate()
        return duplicate_error(self.path, self._numbers[index], case.case_id, self._numbers[first])

    def _exact_duplicate(self) -> CaseFileError | None:
        seen: dict[str, int] = {}
        for i in range(len(self)):
            case_id = self[i].case_id
            if case_id in seen:
                return duplicate_error(self.path, self._numbers[i], case_id, self._numbers[seen[case_id]])
            seen[case_id] = i
        return None

    def __len__(self) -> int:
        return len(self._offsets)

    @overload
    def __getitem__(self, index: int) -> Case: ...

    @overload
    def __getitem__(self, index: slice) -> list[Case]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"case {index} of {len(self)}")
        if self._fh is None:
            self._fh = open(self.path, "rb")
        self._fh.seek(self._offsets[index])
        line = self._fh.read(self._lengths[index])
        number = self._numbers[index]
        if _digest8(line) != self._digests[index]:
            raise CaseFileError(self.path, number, None, "changed since the file was checked; run it again")
        case = parse_line(line.decode("utf-8"), number, self.path)
        assert case is not None  # a line that held a case when checked, unchanged
        return case

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __del__(self) -> None:
        self.close()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fh": None}


def open_cases(path: str | Path) -> tuple[CaseFile, str]:
    """`load_cases` for a run: the same checks and hash, the cases read back one at a time (CaseFile)."""
    cases = CaseFile(path)
    return cases, cases.source


class FhirCaseView(BaseModel):
    """What the acting agent may see of a MedAgentBench task: no `sol`, no `eval_mrn`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    case_id: str
    kind: Literal["fhir"]
    instruction: str
    context: str
    task_type: int
    category: str

    @property
    def question(self) -> str:
        """The instruction, under the name memory policies read (see `FhirCase.question`)."""
        return self.instruction


class FhirCase(BaseModel):
    """A MedAgentBench FHIR task (`handlers/environments/medagentbench/`): the official `instruction`
    and `context`, the task type (1-10), the patient graded against (`eval_mrn`, absent for the two
    "Patient not found" task-1 cases) and, for task 1 only, the official answer `sol`.

    Kept apart from `Case`: `Case` is also the Kafka wire contract (docs/asyncapi.json), which carries
    mcq cases only. The pipeline stages take both; a fhir case needs the MedAgentBench environment on
    the run context (`handlers.environments.medagentbench.environment`), built by `grandrounds run --env
    medagentbench`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    case_id: str = Field(min_length=1)
    kind: Literal["fhir"] = "fhir"
    instruction: str = Field(min_length=1)
    context: str
    task_type: int = Field(ge=1, le=10)
    eval_mrn: str | None = None
    sol: list | None = None
    category: str = Field(default="medagentbench", min_length=1)
    identifiers: CaseIdentifiers | None = None
    """Identifiers the task's text states beyond its patient record (`CaseIdentifiers`), scrubbed exactly."""

    @model_serializer(mode="wrap")
    def _omit_unset_identifiers(self, handler: SerializerFunctionWrapHandler):
        return _omit_unset(handler(self), "identifiers")

    def view(self) -> FhirCaseView:
        return FhirCaseView(case_id=self.case_id, kind=self.kind, instruction=self.instruction,
                            context=self.context, task_type=self.task_type, category=self.category)

    # The names memory policies read of any case (they were written for `Case`): what memory is
    # keyed by, and what the grading reference is called. Properties, not fields: they are not
    # part of the case's JSON (the `case.received` payload) and carry nothing the fields do not.

    @property
    def question(self) -> str:
        """What memory is retrieved and keyed by (episode descriptor, rule triggers): the instruction."""
        return self.instruction

    @property
    def answer(self) -> str:
        """The grading reference, by name: the official refsol rules of the task type (`refsol:task3`)."""
        return f"refsol:task{self.task_type}"


AnyCase = Case | FhirCase
"""A case of the pipeline: an MCQ case, or a MedAgentBench FHIR task (its environment on the run context)."""
