"""The k-subjects rule: a word of a case's text becomes memory only once k distinct subjects' cases hold it.

Pattern de-identification (handlers/deidentify.py) finds what looks like an identifier; most of what
identifies a patient in free text looks like nothing in particular: a surname without an honorific, a
village, a street, a phone number written the way one country writes them. What all of them share is
that they belong to one patient. So memory text (triggers, summaries, guidelines, rules, skills,
lessons, episode descriptors) keeps a word of its case's text only if the cases of at least
`k` distinct subjects (`memory_min_subjects` in the policy config) contain it; a word that only this
patient's cases hold is withheld (`WITHHELD`). A patient with many cases is still one subject: their
name recurring in all of them never reaches k.

Determinism: the counts are a fold over the run's `case.received` events, token -> the first case
index of each distinct subject (at most k kept), read as of the case's own index: "subjects whose
first case is at or before case i". Cases arrive in index order, so the count seen by case i is final
when case i is received, whatever the lag (cases i+1.. received before case i reflects do not count)
and whether the fold ran live or was rebuilt from the log on resume (`Deidentifier` reads the log's
`case.received` events before its first case). A subject is the case's `subject` field, MedAgentBench's
`eval_mrn`, else the case itself (`store/case_content.py`'s reading), so the gate needs no key file.

Not gated: words the case does not hold (a writer's own template words, a model's wording), the
English stopwords, one-character tokens, the tokens of the case's option texts, answer and category
(memory has to name the answer it learned; an option list is clinical vocabulary, and its patient
identifiers, if any, are the pattern and exact passes' business), and the typed placeholders.
"""

from __future__ import annotations

import re
from bisect import insort
from typing import Any, Iterable

from grandrounds.handlers.text import STOPWORDS

WITHHELD = "[...]"
"""What a withheld run of words reads as in memory text (one marker for adjacent words)."""

WORD = re.compile(r"[^\W_]+")
"""A token: a run of letters and digits (any script), so "Vasquez-Whitfield" is two and the digit groups
of "(555) 0100-7000" are tokens too: a phone format only one patient's text uses is withheld as well."""

_NOT_TEXT = frozenset({"case_id", "kind", "subject", "identifiers", "tools", "task_type", "source", "eval_mrn"})
"""Case fields that are no free text of the case: ids, enums, tool names (and the structured identifiers,
which are scrubbed exactly and never counted as vocabulary)."""

_ANSWER_FIELDS = frozenset({"options", "answer", "correct_diagnosis", "category"})
"""Case fields whose tokens pass the gate (see the module docstring); they are counted like the rest."""

_RUN = re.compile(re.escape(WITHHELD) + r"(?:[\s,;:/&+-]+" + re.escape(WITHHELD) + r")+")


def case_subject(case: dict) -> str:
    """Whom a case is about: its `subject`, MedAgentBench's patient MRN, else the case itself."""
    subject = case.get("subject") or case.get("eval_mrn")
    return f"subject:{subject}" if subject else f"case:{case.get('case_id')}"


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def case_tokens(case: dict) -> tuple[frozenset[str], frozenset[str]]:
    """(every token of the case's text, the tokens of its answer fields), lower-cased."""
    every: set[str] = set()
    exempt: set[str] = set()
    for key, value in case.items():
        if key in _NOT_TEXT:
            continue
        toks = set(WORD.findall("\n".join(_strings(value)).lower()))  # (one scan per field, not per string)
        every |= toks
        if key in _ANSWER_FIELDS:
            exempt |= toks
    return frozenset(every), frozenset(exempt)


class SubjectCounts:
    """token -> the first case index of up to k distinct subjects whose cases hold it (the fold)."""

    def __init__(self, k: int):
        if k < 1:
            raise ValueError(f"memory_min_subjects must be at least 1, not {k}")
        self.k = k
        self._first: dict[str, list[tuple[int, str]]] = {}
        self._kth: dict[str, int] = {}
        """token -> the first index of its k-th subject, once it has k: from there on it is common (the fast
        path of `add` and `withheld`: most words of a long run are)."""
        self._cases: set[str] = set()
        self._tokens: tuple[str, tuple[frozenset[str], frozenset[str]]] | None = None  # (case id, case_tokens)

    def _case_tokens(self, case: dict) -> tuple[frozenset[str], frozenset[str]]:
        cid = str(case.get("case_id"))
        if self._tokens is None or self._tokens[0] != cid:  # (add and withheld read the same case in turn)
            self._tokens = (cid, case_tokens(case))
        return self._tokens[1]

    def add(self, case: dict, index: int) -> None:
        """Fold one `case.received` (idempotent: a case folded live and again from the log counts once)."""
        if self.k == 1:
            return  # every token of a case is in its own subject's case: nothing to count
        cid = str(case.get("case_id"))
        if cid in self._cases:
            return
        self._cases.add(cid)
        subject = case_subject(case)
        k, kth = self.k, self._kth
        for tok in self._case_tokens(case)[0]:
            at_k = kth.get(tok)
            if at_k is not None and at_k <= index:
                continue  # k subjects came first already: nothing this case adds changes a count
            firsts = self._first.get(tok)
            if firsts is None:
                self._first[tok] = [(index, subject)]
                continue
            at = next((i for i, (_, s) in enumerate(firsts) if s == subject), None)
            if at is not None:
                if firsts[at][0] <= index:
                    continue
                del firsts[at]  # (a case folded out of order: the subject's first index moves back)
            elif len(firsts) >= k and index >= firsts[-1][0]:
                continue  # k subjects already came first: this one changes no count a case reads
            insort(firsts, (index, subject))
            del firsts[k:]
            if len(firsts) == k:
                kth[tok] = firsts[-1][0]

    def subjects(self, token: str, index: int) -> int:
        """Distinct subjects (at most k) whose cases at or before `index` hold `token`."""
        return sum(1 for i, _ in self._first.get(token, ()) if i <= index)

    def withheld(self, case: dict, index: int) -> frozenset[str]:
        """The tokens of `case` that its memory text may not hold: in fewer than k subjects' cases so far."""
        if self.k == 1:
            return frozenset()
        every, exempt = self._case_tokens(case)
        k, kth = self.k, self._kth
        return frozenset(t for t in every - exempt - STOPWORDS
                         if len(t) > 1 and not ((at_k := kth.get(t)) is not None and at_k <= index)
                         and self.subjects(t, index) < k)


def gate_text(text: str, withheld: frozenset[str], keep: frozenset[str] = frozenset()) -> tuple[str, int]:
    """`text` with every token in `withheld` replaced by `WITHHELD` (adjacent ones as one), and how many.
    Tokens inside `keep` spans (typed placeholders such as `[NAME]`) are left as they are."""
    if not withheld or not text or withheld.isdisjoint(WORD.findall(text.lower())):
        return text, 0  # (one C-speed scan: most memory strings hold none of the case's withheld words)
    n = 0

    def sub(m: re.Match) -> str:
        nonlocal n
        if m.group(0).lower() in withheld:
            start = m.start()
            if start and text[start - 1] == "[" and text[m.end():m.end() + 1] == "]" and m.group(0) in keep:
                return m.group(0)
            n += 1
            return WITHHELD
        return m.group(0)

    out = WORD.sub(sub, text)
    if n > 1:
        out = _RUN.sub(WITHHELD, out)
    return out, n
