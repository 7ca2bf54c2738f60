"""A field de-identification tool (philter-lite, pinned) with the Safe Harbor rules it lacks, typed.

Issue 41: the k-subjects word rule (handlers/subject_gate.py) withholds every word fewer than k subjects'
cases hold, and clinical findings are rare words. A field tool reads one text and flags what looks like
a HIPAA Safe Harbor identifier; this module runs philter-lite 0.6.0 as shipped (its 313 filters,
`configs/philter_delta.toml`) plus rules of our own for what it misses (`../shared/DEIDENTIFICATION.md`,
measured on this machine kind):

- ages over 89 ("aged 93", "93-year-old", "(97)" after a name), which Safe Harbor folds into "90 or
  older" (`[AGE 90+]`);
- phone, fax and record numbers in any layout their context names ("phone (555) 0100-7000", "NHS number
  943 476 5919", "hospital no. H-204-118");
- the year of a date is kept ("12 March 2021" -> "[DATE] 2021"): Safe Harbor removes the other elements
  of a date, not its year (philter removes the year too).

What it finds is typed (`KINDS`: name, place, date, age, id, contact). A span the tool flags only by its
catch-all (a capitalised word it has on no list of ordinary words: a surname, a village, an eponym such
as "Kussmaul") is `certain=False`: whether it is one patient's identifier is a question across patients,
which the k-subjects evidence answers for these tokens only (issue 41 part 2).

philter-lite tags parts of speech with `nltk.pos_tag`, whose model is data NLTK downloads (a pickle):
none ships here, and nothing read from a file is unpickled. The tag feeds only the filters restricted to
proper nouns, so a tagger without data stands in (`_tag`: a capitalised token is `NNP`, digits `CD`, else
`NN`), installed into the pinned version's one seam (`philter_lite.philter._get_pos`).

Determinism: the result is a pure function of the text, the tool's version and its configuration (the
`settings()` a run records; `config_digest` covers the tool's filter file and this module's own rules,
`RULES_VERSION`). Each distinct text is read once a machine: `find` memoises by the settings and the text,
and keeps each result in the machine's de-identification cache (store/machine_cache.py, keyed by
`text_key`: settings digest and the text's sha256), so other processes, workers and permutations read
it back; the tool costs 5-80 ms a text, a cached text well under one.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path

from grandrounds.handlers.text import STOPWORDS
from grandrounds.store.errors import GrandroundsError
from grandrounds.store.machine_cache import span_cache

TOOL = "philter-lite"
TOOL_VERSION = "0.6.0"
"""The pinned version (pyproject.toml); another installed version is refused: its filters decide bytes."""

RULES_VERSION = 1
"""The version of this module's own rules and typing; a change of what they find is a new version."""

KINDS = ("name", "place", "date", "age", "id", "contact")
PLACEHOLDERS = {"name": "[NAME]", "place": "[PLACE]", "date": "[DATE]", "age": "[AGE 90+]", "id": "[ID]",
                "contact": "[CONTACT]"}


@dataclass(frozen=True, order=True)
class Found:
    """One identifier span of a text: [start, stop), its kind, and whether a rule or a typed filter placed
    it (`certain`) or only the tool's catch-all flagged it."""

    start: int
    stop: int
    kind: str
    certain: bool
    text: str


# --- rules of our own (Safe Harbor items the tool misses) -------------------------------------------

_OLD = r"(?:9\d|1[0-4]\d)"
"""An age over 89 (90-149)."""
_AGES = [
    re.compile(r"\b(?:aged?|age of|age:?)\s+(" + _OLD + r")\b(?![.,]\d)", re.I),
    re.compile(r"\b(" + _OLD + r"[- ]?(?:years?|yrs?|yr|y)[- ]?(?:old|of age)?)(?![\w-])", re.I),
    re.compile(r"\b(" + _OLD + r"\s*(?:yo|y/o|y\.o\.?)(?![\w]))", re.I),
    re.compile(r"\b((?:nonagenarian|centenarian|supercentenarian)s?)\b", re.I),
]
_AGE_AFTER_NAME = re.compile(r"\s*\((" + _OLD + r")\)|,\s*(" + _OLD + r")(?=\s*(?:[,;:)]|$|\s+(?:is|was|who|with|"
                             r"presents|presented|attends|attended|comes|came|seen|admitted)\b))")
"""'Rose Baker (97)', 'Åsa Lindström of Kiruna, 93, is seen': an age right after a name or place."""

_DIGITS_GROUPED = r"\+?\(?\d[\d\s().-]{4,}\d"
INTERNATIONAL_PHONE = re.compile(r"(?<![\w+])(?:\+|00)\d{1,3}(?:[\s.-]?\(0\))?(?:[\s.-]?\(?\d{1,5}\)?){2,6}(?![\w-])")
"""+44 20 7946 0958, +49 (0)30 1234567, 0044 ... (also pattern set 2's, handlers/deidentify.py)."""
AREA_CODE_PHONE = re.compile(r"(?<![\w)])\(\d{2,5}\)[\s.-]?\d{2,5}(?:[\s.-]\d{2,5}){0,3}(?![\w-])")
"""(555) 0100-7000, (020) 7946 0958 (also pattern set 2's)."""
_CONTACT = [
    re.compile(r"\b(?:phone|telephone|tel|mobile|cell(?:phone)?|fax|facsimile|pager|bleep|contact(?: number)?|"
               r"call(?:ed)?(?: on| at)?|ring|reached at|whatsapp)\.?(?:\s*(?:no\.?|number|#))?\s*(?:is|:|#|-)?\s*"
               r"(" + _DIGITS_GROUPED + r")", re.I),
    INTERNATIONAL_PHONE,
    AREA_CODE_PHONE,
    re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"),
    re.compile(r"\b(?:https?://|www\.)\S+", re.I),
]
_CONTACT_DIGITS = 7

_ID = [
    re.compile(r"\b(?:MRN|medical record(?: number)?|record(?: number| no\.?)?|hospital(?: number| no\.?)|"
               r"chart(?: number| no\.?)?|NHS(?: number| no\.?)?|health(?: card| insurance)?(?: number| no\.?)|"
               r"national (?:health |insurance |identity )?(?:number|no\.?)|insurance(?: number| no\.?| ID)?|"
               r"policy(?: number| no\.?)|member(?: number| no\.?| ID)|account(?: number| no\.?)?|SSN|"
               r"social security(?: number| no\.?)?|passport(?: number| no\.?)?|licen[cs]e(?: number| no\.?| plate)?|"
               r"plate|certificate(?: number| no\.?)?|serial(?: number| no\.?)?|device(?: number| no\.?| ID)|"
               r"beneficiary(?: number| no\.?)?|identifier|ID(?: number| no\.?)?|patient (?:number|no\.?)|"
               r"accession(?: number| no\.?)?|admission(?: number| no\.?)|unit(?: number| no\.?))"
               r"\s*(?:is|:|#|-|=)?\s*((?:[A-Z]{1,4}[ -]?)?\d[\dA-Z]*(?:[ -][\dA-Z]*\d[\dA-Z]*){0,4})\b", re.I),
    # any record a number's own word introduces ("dossier no. 7781-2290", "file nr 22-118", "number 48213570")
    re.compile(r"\b(?:no\.|nr\.?|num\.|number|#)\s*[:#]?\s*((?:[A-Z]{1,4}[ -]?)?\d[\d/ -]{2,}\d[A-Z]?)\b", re.I),
    re.compile(r"\b\d{3}-\d{2}-\d{4}\b"),
    re.compile(r"(?<![\w&])#\s?[A-Z]{0,3}-?\d{4,}\b"),
]

_YEAR = re.compile(r"(?<!\d)(?:1[89]\d\d|20\d\d)(?!\d)")


def _rule_spans(text: str) -> list[Found]:
    out: list[Found] = []
    for pattern in _AGES:
        for m in pattern.finditer(text):
            out.append(Found(m.start(1), m.end(1), "age", True, m.group(1)))
    for pattern in _CONTACT:
        for m in pattern.finditer(text):
            g = 1 if pattern.groups else 0
            span = m.group(g).rstrip(" .-")
            if "@" not in span and "/" not in span and sum(c.isdigit() for c in span) < _CONTACT_DIGITS:
                continue  # ("call 999", "number 3"): too few digits for a phone
            out.append(Found(m.start(g), m.start(g) + len(span), "contact", True, span))
    for pattern in _ID:
        for m in pattern.finditer(text):
            g = 1 if pattern.groups else 0
            span = m.group(g).rstrip(" -")
            if sum(c.isdigit() for c in span) < 3:
                continue
            out.append(Found(m.start(g), m.start(g) + len(span), "id", True, span))
    return out


# --- the tool ----------------------------------------------------------------------------------------

def _tag(text: str) -> list[tuple[str, str]]:
    """philter's tokens, tagged without data (see the module docstring)."""
    from philter_lite import philter

    tagged = []
    for tok in philter._get_clean(text):
        if tok.isspace():
            tagged.append((tok, "SP"))
        elif tok[:1].isupper():
            tagged.append((tok, "NNP"))
        elif tok[:1].isdigit():
            tagged.append((tok, "CD"))
        else:
            tagged.append((tok, "NN"))
    return tagged


class ToolVersionError(GrandroundsError, RuntimeError):
    """The installed philter-lite is not the pinned one (a setup error: exit 1, the fix in its message)."""


def _check_version() -> None:
    installed = metadata.version("philter-lite")
    if installed != TOOL_VERSION:
        raise ToolVersionError(f"philter-lite {installed} is installed; grandrounds pins {TOOL_VERSION} "
                               f"(its filters decide event bytes): pip install 'philter-lite=={TOOL_VERSION}'")


def _config_bytes() -> bytes:
    return (resources.files("philter_lite") / "configs" / "philter_delta.toml").read_bytes()


@lru_cache(maxsize=1)
def _tool():
    """(philter_lite, its filters): loaded once a process (0.5-4 s)."""
    _check_version()
    import philter_lite
    from philter_lite import philter

    philter._get_pos = _tag  # the pinned version's one call of nltk.pos_tag (never reached: no data, a pickle)
    config = resources.files("philter_lite") / "configs" / "philter_delta.toml"
    with resources.as_file(config) as path:
        filters = philter_lite.load_filters(str(path))
    return philter_lite, filters


def _rules_source() -> str:
    """What our own rules are: the sources of their patterns (a change of one is a change of settings, so
    the digest moves with it; a change of how they are applied bumps `RULES_VERSION`)."""
    patterns = [*_AGES, _AGE_AFTER_NAME, *_CONTACT, *_ID, _YEAR, _PLACE_CUE, _TOKEN, _JOINS, _NUMERIC_DATE,
                _NEXT_CAP]
    return "\n".join(p.pattern for p in patterns) + f"\ncontact digits {_CONTACT_DIGITS}\n"


@lru_cache(maxsize=1)
def settings() -> dict:
    """What a run records of its de-identifier: versions and a digest of the configuration (the tool's
    filter file and our rules' patterns); reads no filter into memory."""
    _check_version()
    filters_digest = hashlib.sha256(_config_bytes()).hexdigest()
    digest = hashlib.sha256(f"{TOOL}=={TOOL_VERSION}\n{filters_digest}\nrules {RULES_VERSION}\n{_rules_source()}"
                            .encode()).hexdigest()
    return {"tool": TOOL, "tool_version": TOOL_VERSION, "rules_version": RULES_VERSION,
            "config_digest": digest}


_PLACE_CUE = re.compile(r"(?:\b(?:from|in|of|at|near|to|lives|living|born|village|town|city|county|"
                        r"province|region|district|works|employed|employer)\W*)$", re.I)


_TOKEN = re.compile(r"[^\W_]+")


def _tool_spans(text: str) -> list[Found]:
    """What the tool masks: every token it does not include (its whitelists and "safe" filters; the
    catch-all masks the rest, as its own `transform_text_asterisk` does), typed where a typed filter
    found it (dates, e-mail, ages) and certain there; otherwise a catch-all token: digits an `id`, a
    capitalised word after a place cue a `place`, else a `name`, none of them certain."""
    philter_lite, filters = _tool()
    include, _, tracker = philter_lite.detect_phi(text, patterns=filters)
    kept = bytearray(len(text))
    for a, b in include.filecoords():
        kept[a:b] = b"\x01" * (b - a)
    typed = bytearray(len(text))  # 0 none; 1 a filter flagged it (untyped); else an index into _TOOL_TYPES + 2
    for entry in tracker.phi:
        code = _TOOL_TYPES.index(entry.phi_type) + 2 if entry.phi_type in _TOOL_TYPES else 1
        typed[entry.start:entry.stop] = bytes([max(code, c) for c in typed[entry.start:entry.stop]])
    out: list[Found] = []
    for m in _TOKEN.finditer(text):
        a, b = m.span()
        if all(kept[a:b]):
            continue
        word = m.group()
        codes = {c for c in typed[a:b] if c}
        if codes and max(codes) > 1:
            kind, certain = _TOOL_KINDS[_TOOL_TYPES[max(codes) - 2]], True
            if kind == "date" and not _could_be_date(text, a, b):
                continue
        elif word.lower() in STOPWORDS or not word[:1].isupper() and not word[:1].isdigit():
            continue  # untyped, on a lower-case word or a stopword: vocabulary its lists lack ("drinks"), or
            # the context word of a span ("phone" of "phone 01451 820 771", whose digits our rules type)
        elif any(c.isdigit() for c in word):
            kind, certain = "id", False
        elif _PLACE_CUE.search(text[max(0, a - 24):a]):
            kind, certain = "place", False
        else:
            kind, certain = "name", False
        if out and out[-1].kind == kind and out[-1].certain == certain and _JOINS.fullmatch(text[out[-1].stop:a]):
            prev = out.pop()
            out.append(Found(prev.start, b, kind, certain, text[prev.start:b]))
        else:
            out.append(Found(a, b, kind, certain, word))
    return out


_JOINS = re.compile(r"[ '’-]|[/.-]")
"""What joins two tokens of one identifier ("Vasquez-Whitfield", "03/04/2022")."""
_TOOL_TYPES = ("DATE", "Email", "Age")
_NUMERIC_DATE = re.compile(r"(\d{1,4})[/.-](\d{1,4})(?:[/.-](\d{1,4}))?")


def _could_be_date(text: str, a: int, b: int) -> bool:
    """Whether the all-digit date the tool found around [a, b) could be one: "72/40 mm Hg" (a blood
    pressure) has no month; a date of words ("12 March") always could."""
    lo, hi = a, b
    while lo > 0 and (text[lo - 1].isdigit() or text[lo - 1] in "/.-") and lo > a - 11:
        lo -= 1
    while hi < len(text) and (text[hi].isdigit() or text[hi] in "/.-") and hi < b + 11:
        hi += 1
    m = _NUMERIC_DATE.fullmatch(text[lo:hi].strip("/.-"))
    if not m:
        return True
    parts = [int(g) for g in m.groups() if g is not None]
    small = [p for p in parts if len(str(p)) <= 2]
    if len(parts) == 2 and len(small) == 2:
        x, y = parts
        return (1 <= x <= 12 and 1 <= y <= 31) or (1 <= x <= 31 and 1 <= y <= 12)
    return any(1 <= p <= 12 for p in small)
_TOOL_KINDS = {"DATE": "date", "Email": "contact", "Age": "age"}


def _keep_years(found: Found) -> list[Found]:
    """A date without its year (Safe Harbor keeps the year): the parts of the span around each year."""
    if found.kind != "date":
        return [found]
    parts, at = [], found.start
    for m in _YEAR.finditer(found.text):
        start, stop = found.start + m.start(), found.start + m.end()
        if start > at:
            parts.append((at, start))
        at = stop
    if at < found.stop:
        parts.append((at, found.stop))
    out = []
    for a, b in parts:
        piece = found.text[a - found.start:b - found.start]
        lead = len(piece) - len(piece.lstrip(" ,./-"))
        piece = piece.strip(" ,./-")
        if any(c.isalnum() for c in piece):
            out.append(Found(a + lead, a + lead + len(piece), "date", True, piece))
    return out


_PRECEDENCE = {"age": 0, "contact": 1, "id": 2, "date": 3, "name": 4, "place": 5}


def _merge(text: str, spans: list[Found]) -> list[Found]:
    """Non-overlapping spans, ordered: where two overlap, the union, typed by the more certain / more
    specific one (a rule's phone over the tool's "OTHER" digits)."""
    merged: list[Found] = []
    for f in sorted(spans, key=lambda f: (f.start, -f.stop)):
        if merged and f.start < merged[-1].stop:
            last = merged[-1]
            best = min((last, f), key=lambda x: (not x.certain, _PRECEDENCE[x.kind]))
            start, stop = last.start, max(last.stop, f.stop)
            merged[-1] = Found(start, stop, best.kind, last.certain or f.certain, text[start:stop])
        else:
            merged.append(f)
    return merged


def _compute(text: str) -> tuple[Found, ...]:
    """What the tool and our rules find in `text` (no cache)."""
    tool = _tool_spans(text)
    spans = _extend_names(text, _merge(text, _rule_spans(text) + [piece for f in tool for piece in _keep_years(f)]))
    ages = []
    for f in spans:  # "Rose Baker (97)", "of Kiruna, 93, is seen"
        if f.kind in ("name", "place"):
            m = _AGE_AFTER_NAME.match(text, f.stop)
            if m:
                g = 1 if m.group(1) else 2
                ages.append(Found(m.start(g), m.end(g), "age", True, m.group(g)))
    return tuple(_merge(text, spans + ages)) if ages else tuple(spans)


_NEXT_CAP = re.compile(r"(?:[ -]|, )([^\W\d_][\w'’]*)")


def _extend_names(text: str, spans: list[Found]) -> list[Found]:
    """A name or place runs on through the capitalised words right after it, or after a comma: the tool keeps
    an English word ("of Little Snoring" flags "Little"; "Snoring" is on its list of ordinary words), and
    an address lists its parts ("Nsawam, Adabraka-Osu")."""
    out: list[Found] = []
    for i, f in enumerate(spans):
        stop = f.stop
        if f.kind in ("name", "place"):
            limit = spans[i + 1].start if i + 1 < len(spans) else len(text)
            while ((m := _NEXT_CAP.match(text, stop)) and m.end() <= limit and m.group(1)[0].isupper()
                   and m.group(1).lower() not in STOPWORDS and not m.group(1).isupper()):
                stop = m.end()  # (not an acronym: "Nsawam, Adabraka" runs on, "Kussmaul, CSF" stops)
        out.append(f if stop == f.stop else Found(f.start, stop, f.kind, f.certain, text[f.start:stop]))
    return out


def find(text: str) -> tuple[Found, ...]:
    """The identifier spans of `text`, ordered and not overlapping: memoised in the process, then read
    from the machine's de-identification cache (store/machine_cache.py, by `text_key`), and only then
    computed by the tool (whose filters load on the first text no cache holds)."""
    if not text or not text.strip():
        return ()
    digest = settings()["config_digest"]
    memo = _MEMO.get((digest, text))
    if memo is not None:
        return memo
    cache = span_cache()
    key = text_key(text) if cache is not None else ""
    found = _from_json(text, cache.get(key)) if cache is not None else None
    if found is None:
        found = _compute(text)
        if cache is not None:
            cache.put(key, _to_json(found))
    if len(_MEMO) >= 65536:  # a long stream: keep the recent texts only
        del _MEMO[next(iter(_MEMO))]
    _MEMO[(digest, text)] = found
    return found


_MEMO: dict[tuple[str, str], tuple[Found, ...]] = {}


def _to_json(found: tuple[Found, ...]) -> str:
    return json.dumps([[f.start, f.stop, f.kind, f.certain] for f in found], separators=(",", ":"))


def _from_json(text: str, raw: str | None) -> tuple[Found, ...] | None:
    """The spans a cache row holds, or None when it holds none or anything but spans of this text: each
    [start, stop, kind, certain] with 0 <= start < stop <= len(text), in order, not overlapping, and a
    kind of `KINDS` (the span's text is the text's own slice, so a row cannot bring words of its own)."""
    if raw is None:
        return None
    try:
        rows = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(rows, list):
        return None
    out: list[Found] = []
    at = 0
    for r in rows:
        if not (isinstance(r, list) and len(r) == 4 and all(type(x) is int for x in r[:2])
                and r[2] in KINDS and type(r[3]) is bool and at <= r[0] < r[1] <= len(text)):
            return None
        out.append(Found(r[0], r[1], r[2], r[3], text[r[0]:r[1]]))
        at = r[1]
    return tuple(out)


def redact(text: str, placeholders: dict[str, str] = PLACEHOLDERS) -> str:
    """`text` with each span replaced by its kind's placeholder (adjacent ones of a kind as one)."""
    out, at = [], 0
    for f in find(text):
        gap = text[at:f.start]
        tag = placeholders[f.kind]
        if out and out[-1] == tag and not gap.strip(" -/."):
            at = f.stop
            continue
        out += [gap, tag]
        at = f.stop
    out.append(text[at:])
    return "".join(out)


def text_key(text: str) -> str:
    """The cache key of a text's result: settings digest and the text's sha256 (a persistent cache's key,
    as the embedding cache keys its vectors)."""
    return settings()["config_digest"] + ":" + hashlib.sha256(text.encode("utf-8")).hexdigest()
