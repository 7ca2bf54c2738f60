"""FHIR search semantics of a HAPI FHIR JPA server, for the Patient parameters MedAgentBench uses.

Read from the FHIR R4 search specification and HAPI's string indexing (values normalised for
search: accents stripped, case folded; each name part indexed on its own):

- string (`name`, `family`, `given`): the parameter value matches when it is a *prefix* of one
  indexed value after normalisation. `name` indexes every part of every HumanName separately
  (family, each given, prefix, suffix, text), so `name=Peter Stafford` matches no patient whose
  name has no `text` "Peter Stafford..." (HAPI: none), while `name=pet` finds Peter. Modifiers
  `:exact` (whole value, case- and accent-sensitive) and `:contains` (substring).
- token (`identifier`, `gender`, `_id`): `system|code`, `|code` (no system) or `code`; exact.
  `identifier` matches `Patient.identifier` only, not the resource id.
- date (`birthdate`): optional prefix eq/ne/lt/gt/le/ge/sa/eb/ap and a value of year, month or day
  precision: `birthdate=1932` is every birth date in 1932; `eq` means the resource's day lies in the
  value's range.
- a comma inside one value is OR; a repeated parameter is AND (`name=peter&name=staff`).
- `_count`, `_format`, `_pretty`, `_summary`, `_sort`, `_elements`, `_total` do not filter.
An unknown parameter is an error (HAPI answers 400), which `SearchError` carries.
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
import calendar
import re
import unicodedata
from datetime import date

NON_FILTERING = frozenset({"_count", "_format", "_pretty", "_summary", "_sort", "_elements", "_total"})
_DATE = re.compile(r"^(eq|ne|lt|gt|le|ge|sa|eb|ap)?(\d{4})(?:-(\d{2})(?:-(\d{2}))?)?$")


class SearchError(InvalidInput, ValueError):
    """A search the server refuses (HTTP 400), with HAPI's kind of message."""


def normalise(text: str) -> str:
    """HAPI's search normalisation: accents stripped, case folded (it upper-cases; equivalent here)."""
    return "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c)).casefold()


def _name_parts(p: dict, which: str) -> list[str]:
    out: list[str] = []
    for n in p.get("name", []):
        if which in ("name", "family") and n.get("family"):
            out.append(n["family"])
        if which in ("name", "given"):
            out.extend(n.get("given", []))
        if which == "name":
            out.extend(n.get("prefix", []))
            out.extend(n.get("suffix", []))
            if n.get("text"):
                out.append(n["text"])
    return out


def _string_match(values: list[str], wanted: str, modifier: str) -> bool:
    if modifier == "exact":
        return wanted in values
    w = normalise(wanted)
    if modifier == "contains":
        return any(w in normalise(v) for v in values)
    return any(normalise(v).startswith(w) for v in values)


def _token_match(codes: list[tuple[str | None, str]], wanted: str) -> bool:
    if "|" in wanted:
        system, _, code = wanted.partition("|")
        if system == "":  # `|code`: a code without a system
            return any(s is None and c == code for s, c in codes)
        return any(s == system and (code == "" or c == code) for s, c in codes)
    return any(c == wanted for _, c in codes)


def _day_range(value: str) -> tuple[date, date, str]:
    m = _DATE.match(value)
    if m is None:
        raise SearchError(f"Invalid date/time format: \"{value}\"")
    prefix, y, mo, d = m.group(1) or "eq", int(m.group(2)), m.group(3), m.group(4)
    try:
        if d is not None:
            lo = hi = date(y, int(mo), int(d))
        elif mo is not None:
            lo = date(y, int(mo), 1)
            hi = date(y, int(mo), calendar.monthrange(y, int(mo))[1])
        else:
            lo, hi = date(y, 1, 1), date(y, 12, 31)
    except ValueError:
        raise SearchError(f"Invalid date/time format: \"{value}\"") from None
    return lo, hi, prefix


def _date_match(birth: str | None, wanted: str) -> bool:
    lo, hi, prefix = _day_range(wanted)
    if not birth:
        return False
    try:
        day = date.fromisoformat(birth[:10])
    except ValueError:
        return False
    if prefix in ("eq", "ap"):
        return lo <= day <= hi
    if prefix == "ne":
        return not lo <= day <= hi
    if prefix in ("gt", "sa"):
        return day > hi
    if prefix in ("lt", "eb"):
        return day < lo
    if prefix == "ge":
        return day >= lo
    return day <= hi  # le


def _one(p: dict, name: str, modifier: str, wanted: str) -> bool:
    if name in ("name", "family", "given"):
        return _string_match(_name_parts(p, name), wanted, modifier)
    if name == "identifier":
        return _token_match([(i.get("system"), i.get("value", "")) for i in p.get("identifier", [])], wanted)
    if name == "gender":
        return _token_match([(None, p.get("gender", ""))], wanted)
    if name == "_id":
        return p.get("id") == wanted
    if name == "birthdate":
        return _date_match(p.get("birthDate"), wanted)
    raise SearchError(f"Unknown search parameter \"{name}\" for resource type \"Patient\"")


def check(params: list[tuple[str, str]]) -> None:
    """Refuse what HAPI refuses before any resource is read (unknown parameters, bad dates)."""
    for key, value in params:
        name, _, modifier = key.partition(":")
        if name in NON_FILTERING:
            continue
        if name not in ("name", "family", "given", "identifier", "gender", "_id", "birthdate"):
            raise SearchError(f"Unknown search parameter \"{name}\" for resource type \"Patient\"")
        if modifier and modifier not in ("exact", "contains", "missing"):
            raise SearchError(f"Invalid modifier \":{modifier}\" for parameter \"{name}\"")
        if name == "birthdate":
            for v in value.split(","):
                _day_range(v)


def matches(p: dict, params: list[tuple[str, str]]) -> bool:
    """Every parameter (repeats included) must match: AND; the comma-separated values of one: OR."""
    for key, value in params:
        name, _, modifier = key.partition(":")
        if name in NON_FILTERING:
            continue
        if modifier == "missing":
            present = bool(_name_parts(p, name)) if name in ("name", "family", "given") else bool(
                p.get({"birthdate": "birthDate", "_id": "id"}.get(name, name)))
            if present == (value == "true"):
                return False
            continue
        if not any(_one(p, name, modifier, v) for v in value.split(",")):
            return False
    return True


def search(patients: list[dict], params: list[tuple[str, str]]) -> list[dict]:
    check(params)
    return [p for p in patients if matches(p, params)]
