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

RULES_VERSION = 2
"""The version of this module's own rules and typing; a change of what they find is a new version. Every
version stays runnable (`find(text, rules)`): a run records the version it used (de-identifier pattern set
3 ran rules 1, pattern set 4 runs rules 2, handlers/deidentify.py) and re-executes with it."""
RULES_VERSIONS = (1, 2)


def rules_version(patterns: int) -> int:
    """The rules version a de-identifier pattern set runs (handlers/deidentify.py): 3 ran 1, 4 runs 2."""
    return 1 if patterns <= 3 else 2

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

_ID_FIXED = [re.compile(_ID[0].pattern.replace(r"|unit(?: number| no\.?))", r"|unit(?: number| no\.?))(?![^\W\d_])"),
                        re.I), *_ID[1:]]
"""Rules 2: the context word of a record number is a whole word (rules 1 read "platelets 250 000" as a
plate's number)."""
assert _ID_FIXED[0].pattern != _ID[0].pattern

_YEAR = re.compile(r"(?<!\d)(?:1[89]\d\d|20\d\d)(?!\d)")

# --- rules version 2 (de-identifier pattern set 4): more Safe Harbor items, and what is medicine, not a name -

_UNITS = r"(?:one|two|three|four|five|six|seven|eight|nine)"
_OLD_WORDS = (r"(?:ninety(?:[- ]" + _UNITS + r")?|(?:a|one)[- ]hundred(?:[- ](?:and[- ])?(?:" + _UNITS +
              r"|ten|eleven|twelve|(?:twen|thir|for|fif)ty(?:[- ]" + _UNITS + r")?))?)")
_AGES_2 = [
    re.compile(r"\b(?:aged?|age of)\s+(" + _OLD_WORDS + r")\b", re.I),
    re.compile(r"\b(" + _OLD_WORDS + r")\b(?![- ](?:" + _UNITS + r")\b)(?!\s*(?:%|per\b|percent|mm|mg|min|sec|beats|"
               r"breaths|times|kg|cm|ml|units|cases|patients|days|hours|weeks|months|of\b))", re.I),
    re.compile(r"\b(" + _OLD_WORDS + r"[- ](?:years?|yrs?)[- ]?(?:old|of age)?)(?![\w-])", re.I),
]
"""Ages over 89 in words ("aged ninety-two", "a hundred and one years old")."""
_CONTACT_2 = [
    re.compile(r"(?<![\w@.])@[A-Za-z0-9_](?:[A-Za-z0-9_.]{0,28}[A-Za-z0-9_])?(?![\w@])"),
    re.compile(r"\b(?:https?://|www\.)[^\s)\]>,;\"']+", re.I),
    re.compile(r"\b[a-z0-9][\w-]*(?:\.[a-z0-9][\w-]*)*\.(?:co\.uk|org\.uk|com|org|net|info|io|me|de|fr|es|it|nl|"
               r"se|no|pl|br|pt|au|ca|in|cn|jp)\b(?:/[^\s)\]>,;\"']*)?", re.I),
]
"""Social-media handles, and web addresses with or without a scheme (rules 1 required seven digits in any
contact, so a URL without digits passed it)."""
_DATE_2 = [
    re.compile(r"\b(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day,?\s+(?:the\s+)?\d{1,2}(?:st|nd|rd|th)\b", re.I),
    re.compile(r"\b(?:the\s+)?\d{1,2}(?:st|nd|rd|th)\s+of\s+(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\b",
               re.I),
    re.compile(r"\b(?:Christmas|New Year'?s?|Boxing|Easter|Thanksgiving|Hallowe'?en|Valentine'?s?)(?:\s+(?:Eve|Day))?"
               r"(?=\s+(?:of\s+)?(?:1[89]|20)\d\d\b)", re.I),
]
"""A day of a month by its weekday or ordinal ("Tuesday 14th", "the 3rd of May"); a holiday of a given year."""
_ID_CONTEXT_2 = re.compile(
    r"\b(?i:plate|registration|reg\.?|serial(?: number| no\.?)?|VIN|device(?: ID| number| no\.?)?|"
    r"ref(?:erence)?\.?(?: no\.?)?|member(?:ship)?(?: ID| number| no\.?)?|policy(?: ID)?)(?![\w])\s*(?:is|:|#|-)?\s*"
    r"([A-Z0-9](?:[A-Z0-9/-]|\s(?=[A-Z0-9]{2,}\b))+[A-Z0-9])\b")
"""An identifier a context word introduces, letters and digits together ("plate KX19 ABC", "serial SN-4471-XQ",
"case ref KX/2231"): the whole code, not only its digits."""

_EPONYM_HEAD = re.compile(
    r"(?:['’]s)?(?:[- ](?:[A-Z][\w'’]*|and|de|von|van)){0,3}[- ]+(?i:disease|syndrome|sign|signs|phenomenon|lymphoma|"
    r"sarcoma|tumou?r|test|triad|tetrad|pentad|reflex|node|nodes|nodule|nodules|lesion|lesions|spot|spots|"
    r"respiration|respirations|breathing|palsy|crisis|pupil|pupils|ring|rings|point|stain|staining|score|criteria|"
    r"classification|scale|manoeuvre|maneuver|fracture|ulcer|cyst|body|bodies|cell|cells|granules|law|hernia|"
    r"o?esophagus|encephalopathy|arteritis|thyroiditis|gait|murmur|rash|anomaly|malformation|diverticulum|"
    r"dementia|chorea|ataxia|dystrophy|disorder|phenomena|procedure|operation|incision|position|line|lines|"
    r"angle|space|duct|canal|pouch|gland|glands|fossa|fold|cords?|plexus|method|technique|equation|formula|"
    r"index|ratio|effect|response|triangle|membrane|toxin|bacillus|infection|fever|virus|leukaemia|leukemia|"
    r"carcinoma|myopathy|neuropathy|neuralgia|contracture|deformity|sequence|protocol|catheter|tube|shunt|"
    r"bundle|tract|muscle|nerve|artery|vein|loop|valve|solution|agar|medium|forceps|block|pattern|wave|waves|"
    r"sound|sounds|crackles|lymphadenopathy|tremor|type|variant)\b")
"""A capitalised word used as an eponym: directly before what it names ("Kussmaul breathing", "Raynaud's
phenomenon", "Guillain-Barré syndrome", "Hodgkin lymphoma"). A person's name in a note is not followed so."""
_FACILITY = re.compile(r"\s+(?i:clinic|centre|center|hospital|unit|service|ward|department|practice|surgery|"
                       r"institute|foundation|trust|society|programme|program|team|group|network|registry|"
                       r"laboratory|lab|pavilion|wing|suite|office)\b")
"""After an eponym's head, a facility: the capitalised word names the place ("Vancouver lymphoma clinic")."""
_AGE_IN_BRACKETS = re.compile(r"[^\W\d_][\w'’-]*[\"”’']?\s*\((" + _OLD + r")\)")
"""'Harold "Harry" Marrow (101)': an age in brackets right after any capitalised word (rules 2; rules 1 only
after a span the tool flagged, which a name that is also an ordinary word is not)."""
_HANDLE = re.compile(r"(?<![\w@.])[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+(?![\w@])")
"""A user name with an underscore ("tonyzhou_yvr"): no word of a language is written so."""
_DIGIT_GROUPS = re.compile(r"(?<![\d.,/])\d{2,6}(?:[ -]\d{2,6}){1,4}(?![\d]|[.,/]\d)(?!\s*(?:%|[a-zA-Zµμ]+/|mm|mg|g/|ml|mL|"
                           r"cells|x|×|IU|U/))")
"""A number of eight or more digits in groups, whatever names it ("tarjeta sanitaria CACE 5830 0092 61",
"PHN 9876 543 210"): a count or a measurement is not written so."""
_ID_DIGITS = 8
_NUMBER_WORDS = frozenset(
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty thirty forty fifty sixty seventy eighty hundred thousand".split())
_SEASON = re.compile(r"(?:spring|summer|autumn|fall|winter)(?:\s+of)?", re.I)
_SEASON_YEAR = re.compile(r"\s*(?:of\s+)?(?:(?:1[89]|20)\d\d\b|['’]\d\d\b)")
_LIST_JOIN = re.compile(r"\s*(?:,\s*(?:and\s+|or\s+)?|\s(?:and|or)\s+|/)\s*")


def is_large_place(text: str) -> bool:
    """Whether `text` names a country or a US state (Safe Harbor keeps them; rules 2)."""
    return text.strip().lower() in _large_places()


@lru_cache(maxsize=1)
def _large_places() -> frozenset[str]:
    """Countries (ISO 3166: names, common and official names) and US states, lower-cased: Safe Harbor
    removes geographic subdivisions smaller than a State, so these stay ("emigrated from Brazil")."""
    import pycountry

    names: set[str] = set()
    for c in pycountry.countries:
        names.update(getattr(c, k).lower() for k in ("name", "common_name", "official_name") if hasattr(c, k))
    names.update(s.name.lower() for s in pycountry.subdivisions.get(country_code="US") if s.type == "State")
    return frozenset(names)


def _rule_spans_2(text: str) -> list[Found]:
    out: list[Found] = []
    for pattern in _AGES_2:
        out += [Found(m.start(1), m.end(1), "age", True, m.group(1)) for m in pattern.finditer(text)]
    for pattern in _CONTACT_2:
        for m in pattern.finditer(text):
            span = m.group().rstrip(".")
            out.append(Found(m.start(), m.start() + len(span), "contact", True, span))
    for pattern in _DATE_2:
        out += [Found(m.start(), m.end(), "date", True, m.group()) for m in pattern.finditer(text)]
    for m in _ID_CONTEXT_2.finditer(text):
        if any(c.isdigit() for c in m.group(1)):
            out.append(Found(m.start(1), m.end(1), "id", True, m.group(1)))
    out += [Found(m.start(1), m.end(1), "age", True, m.group(1)) for m in _AGE_IN_BRACKETS.finditer(text)]
    out += [Found(m.start(), m.end(), "contact", True, m.group()) for m in _HANDLE.finditer(text)]
    out += [Found(m.start(), m.end(), "id", True, m.group()) for m in _DIGIT_GROUPS.finditer(text)
            if sum(c.isdigit() for c in m.group()) >= _ID_DIGITS]
    out += _subdivisions(text)
    return out


_CAP_WORD = re.compile(r"[^\W\d_][\w'’-]*")


@lru_cache(maxsize=1)
def _small_places() -> frozenset[str]:
    """The subdivisions of every country (ISO 3166-2, pycountry), lower-cased, less US states and whatever is
    also a country: counties, provinces, regions ("Lincolnshire", "Extremadura"), which a field tool's lists of
    ordinary words may hold."""
    import pycountry

    large = _large_places()
    return frozenset(n for n in (s.name.lower() for s in pycountry.subdivisions)
                     if n not in large and n not in STOPWORDS and len(n) >= 4)


def _subdivisions(text: str) -> list[Found]:
    """Capitalised runs of up to four words that name a subdivision: an uncertain place (the k-subjects
    evidence decides it, as for any word the tool flags but cannot place: "Down syndrome" is not one)."""
    words = [m for m in _CAP_WORD.finditer(text)]
    out: list[Found] = []
    i = 0
    while i < len(words):
        hit = None
        if words[i].group()[:1].isupper():
            for n in (4, 3, 2, 1):
                run = words[i:i + n]
                if len(run) < n or any(text[a.end():b.start()] != " " for a, b in zip(run, run[1:])):
                    continue
                if text[run[0].start():run[-1].end()].lower() in _small_places():
                    hit = run
                    break
        if hit:
            out.append(Found(hit[0].start(), hit[-1].end(), "place", False, text[hit[0].start():hit[-1].end()]))
            i += len(hit)
        else:
            i += 1
    return out


def _not_identifiers(text: str, spans: list[Found]) -> list[Found]:
    """Rules 2: the spans that are medicine or allowed, not a patient's identifier, left out. An uncertain
    name or place used as an eponym (`_EPONYM_HEAD`), or made of number words ("Forty-eight hours");
    a country or US state after a place cue ("from Brazil") or in a list that one begins ("Mali, Niger
    and Chad"); a season not of a year ("after a fall"; "in the fall of 2019" stays a date)."""
    out: list[Found] = []
    place_list_end = -1
    for f in spans:
        low = f.text.lower()
        if f.kind in ("name", "place"):
            head = _EPONYM_HEAD.match(text, f.stop) if not f.certain else None
            if head and not _FACILITY.match(text, head.end()):
                continue
            words = [w for w in re.split(r"[\s-]+", low) if w]
            if not f.certain and words and all(w in _NUMBER_WORDS for w in words):
                continue
            if low in _large_places() and (_PLACE_CUE.search(text[max(0, f.start - 24):f.start]) or
                                           (place_list_end >= 0 and _LIST_JOIN.fullmatch(text[place_list_end:f.start]))):
                place_list_end = f.stop
                continue
        if f.kind == "date" and _SEASON.fullmatch(f.text) and not _SEASON_YEAR.match(text, f.stop):
            continue
        out.append(f)
    return out


def _rule_spans(text: str, rules: int = RULES_VERSION) -> list[Found]:
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
    for pattern in (_ID if rules < 2 else _ID_FIXED):
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


def _rules_source(rules: int) -> str:
    """What our own rules are: the sources of their patterns (a change of one is a change of settings, so
    the digest moves with it; a change of how they are applied bumps `RULES_VERSION`). Rules 2 adds its own
    patterns and the geography data's version; rules 1's source is exactly what it was."""
    patterns = [*_AGES, _AGE_AFTER_NAME, *_CONTACT, *_ID, _YEAR, _PLACE_CUE, _TOKEN, _JOINS, _NUMERIC_DATE,
                _NEXT_CAP]
    source = "\n".join(p.pattern for p in patterns) + f"\ncontact digits {_CONTACT_DIGITS}\n"
    if rules >= 2:
        more = [_ID_FIXED[0], *_AGES_2, *_CONTACT_2, *_DATE_2, _ID_CONTEXT_2, _EPONYM_HEAD, _FACILITY, _AGE_IN_BRACKETS, _HANDLE,
                _DIGIT_GROUPS, _CAP_WORD, _SEASON, _SEASON_YEAR, _LIST_JOIN]
        source += "\n".join(p.pattern for p in more) + "\nnumber words " + " ".join(sorted(_NUMBER_WORDS)) + \
            f"\nid digits {_ID_DIGITS}\ncaseless scripts flagged\n" + \
            f"\ngeography pycountry=={metadata.version('pycountry')}\n"
    return source


def _check_rules(rules: int) -> None:
    if rules not in RULES_VERSIONS:
        raise ToolVersionError(f"de-identifier rules version {rules} is not one this build has "
                               f"({', '.join(map(str, RULES_VERSIONS))})")


@lru_cache(maxsize=4)
def settings(rules: int = RULES_VERSION) -> dict:
    """What a run records of its de-identifier: versions and a digest of the configuration (the tool's
    filter file and our rules' patterns) of rules version `rules`; reads no filter into memory."""
    _check_version()
    _check_rules(rules)
    filters_digest = hashlib.sha256(_config_bytes()).hexdigest()
    digest = hashlib.sha256(f"{TOOL}=={TOOL_VERSION}\n{filters_digest}\nrules {rules}\n{_rules_source(rules)}"
                            .encode()).hexdigest()
    return {"tool": TOOL, "tool_version": TOOL_VERSION, "rules_version": rules, "config_digest": digest}


_PLACE_CUE = re.compile(r"(?:\b(?:from|in|of|at|near|to|lives|living|born|village|town|city|county|"
                        r"province|region|district|works|employed|employer)\W*)$", re.I)


_TOKEN = re.compile(r"[^\W_]+")


def _tool_spans(text: str, rules: int = RULES_VERSION) -> list[Found]:
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
        elif word.lower() in STOPWORDS or not word[:1].isupper() and not word[:1].isdigit() and not (
                rules >= 2 and word[:1].isalpha() and word[:1].lower() == word[:1].upper()):
            # (rules 2: a word of a script without case, "周伟明", is flagged as a capitalised one is)
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


def _compute(text: str, rules: int = RULES_VERSION) -> tuple[Found, ...]:
    """What the tool and our rules (of version `rules`) find in `text` (no cache)."""
    tool = _tool_spans(text, rules)
    ours = _rule_spans(text, rules) + (_rule_spans_2(text) if rules >= 2 else [])
    spans = _extend_names(text, _merge(text, ours + [piece for f in tool for piece in _keep_years(f)]))
    if rules >= 2:
        spans = _not_identifiers(text, spans)
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


def find(text: str, rules: int = RULES_VERSION) -> tuple[Found, ...]:
    """The identifier spans of `text` under our rules of version `rules`, ordered and not overlapping:
    memoised in the process, then read from the machine's de-identification cache (store/machine_cache.py,
    by `text_key`), and only then computed by the tool (whose filters load on the first text no cache
    holds)."""
    if not text or not text.strip():
        return ()
    digest = settings(rules)["config_digest"]
    memo = _MEMO.get((digest, text))
    if memo is not None:
        return memo
    cache = span_cache()
    key = text_key(text, rules) if cache is not None else ""
    found = _from_json(text, cache.get(key)) if cache is not None else None
    if found is None:
        found = _compute(text, rules)
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


def redact(text: str, placeholders: dict[str, str] = PLACEHOLDERS, rules: int = RULES_VERSION) -> str:
    """`text` with each span replaced by its kind's placeholder (adjacent ones of a kind as one)."""
    out, at = [], 0
    for f in find(text, rules):
        gap = text[at:f.start]
        tag = placeholders[f.kind]
        if out and out[-1] == tag and not gap.strip(" -/."):
            at = f.stop
            continue
        out += [gap, tag]
        at = f.stop
    out.append(text[at:])
    return "".join(out)


def text_key(text: str, rules: int = RULES_VERSION) -> str:
    """The cache key of a text's result: settings digest and the text's sha256 (a persistent cache's key,
    as the embedding cache keys its vectors)."""
    return settings(rules)["config_digest"] + ":" + hashlib.sha256(text.encode("utf-8")).hexdigest()
