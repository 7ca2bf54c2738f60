"""Lexical helpers shared by the simulated backbone and rule triggers."""

from __future__ import annotations

import re
import sys
from bisect import bisect_left
from functools import lru_cache

import numpy as np

from grandrounds.store import exact_math

_TOKEN = re.compile(r"[a-z][a-z0-9]+")

STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further had has
have having he her here hers herself him himself his how i if in into is it its itself just me more
most my myself no nor not now of off on once only or other our ours out over own same she should so
some such than that the their theirs them then there these they this those through to too under
until up very was we were what when where which while who whom why will with would you your
following likely likeliest best next step appropriate diagnosis patient patients presents presented
presenting year years old man woman boy girl male female history shows showing reveals revealed
examination exam findings finding physical department emergency hospital clinic brought arrives
arrived complains reports reported noted notes today hours hour days day weeks week months month
mild moderate severe acute new recent recently prior previous previously well known sudden onset
""".split())


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def content_tokens(text: str) -> set[str]:
    return set(_content_tokens(text))  # a fresh set: callers may change theirs


@lru_cache(maxsize=4096)
def _content_tokens(text: str) -> frozenset[str]:
    """Memoised: a pure function of the text, and a case's question and option texts are tokenised
    again by every step that reads them (the sim backbone's choice, the review gate's checks of each
    proposed rule and guideline against each option, the rule floor): a regex pass each time."""
    return frozenset(t for t in tokens(text) if t not in STOPWORDS)


def key_terms(text: str, limit: int = 12) -> list[str]:
    """Distinctive words of a case in order of appearance: the trigger of what memory learns from it."""
    seen: list[str] = []
    for t in tokens(text):
        if t in STOPWORDS or len(t) < 4 or t.isdigit() or t in seen:
            continue
        seen.append(t)
    return seen[:limit]


def trigger_overlap(trigger: list[str], case_tokens: set[str]) -> float:
    if not trigger:
        return 0.0
    return sum(1 for t in trigger if t in case_tokens) / len(trigger)




def _idf_term(n: int, d: int) -> float:
    """BM25's idf, log(n - d + 0.5) - log(d + 0.5), with logs that are the same float on every
    platform (store/exact_math.py), not the platform libm's."""
    return exact_math.ln(n - d + 0.5) - exact_math.ln(d + 0.5)


class TermIndex:
    """Okapi BM25 over a growing set of texts (past cases), kept incrementally: term and document
    frequencies per text, so scoring a few candidates costs nothing however large memory grows.

    Why: cosine over MiniLM sentence vectors ranks a reworded case of the same diagnosis first for
    23 of 28 held-out cases of benchmarks/bench_real_model.py's stream; BM25 over the shared findings,
    among the cosine candidates, for 25 of 28. The formula and constants are rank_bm25's
    `BM25Okapi` (k1 1.5, b 0.75, a negative idf floored at epsilon·mean idf), and
    tests/test_term_index.py checks the scores against it. Sums run over sorted words, so a score
    is the same float in every process (set order follows the string hash seed)."""

    K1, B, EPSILON = 1.5, 0.75, 0.25

    def __init__(self) -> None:
        self.tf: dict[str, dict[str, int]] = {}
        self.df: dict[str, int] = {}
        self.dl: dict[str, int] = {}  # words per text (sum of its term frequencies)
        self.total_len = 0
        self._floor: tuple[int, float] | None = None  # (corpus size it was computed at, floor)
        self._vocab: list[str] = []  # the vocabulary in sorted order, kept for `_idf`
        self._dfs = np.zeros(0, dtype=np.int64)  # the document frequency of each word of `_vocab`
        self._new_words: list[str] = []  # words added since `_vocab` was last merged
        self._touched: list[str] = []  # words of `_vocab` whose document frequency rose since then

    def __len__(self) -> int:
        return len(self.tf)

    @staticmethod
    def words(text: str) -> list[str]:
        return [t for t in tokens(text) if t not in STOPWORDS]

    def add(self, key: str, text: str) -> None:
        if key in self.tf:
            return
        words = self.words(text)
        freq: dict[str, int] = {}
        for w in words:
            freq[w] = freq.get(w, 0) + 1
        self.tf[key] = freq
        self.dl[key] = len(words)
        self.total_len += len(words)
        for w in freq:
            d = self.df.get(w, 0)
            (self._touched if d else self._new_words).append(w)
            self.df[w] = d + 1

    def _sync_vocab(self) -> None:
        """Bring `_vocab` and `_dfs` up to `df`: new words merged in at their sorted places, the
        document frequencies of the words seen again updated in place (a bisection each)."""
        df = self.df
        if self._new_words:
            new = sorted(self._new_words)
            at = [bisect_left(self._vocab, w) for w in new]  # places in the old order (non-decreasing)
            self._dfs = np.insert(self._dfs, at, [df[w] for w in new])
            # The same sorted list as `sorted(vocab + new)`, by inserting each new word at its place, the
            # last first (so the places found in the old order stay right, and words sharing a place keep
            # their order): a few pointer moves instead of a merge comparing every word (~60 -> ~5 us a
            # text at 6,000 words).
            vocab = self._vocab
            for i in range(len(new) - 1, -1, -1):
                vocab.insert(at[i], new[i])
            self._new_words = []
        vocab, dfs = self._vocab, self._dfs
        for w in self._touched:
            dfs[bisect_left(vocab, w)] = df[w]
        self._touched = []

    def _idf(self) -> tuple[int, float]:
        """(corpus size, the floor for negative idf): epsilon times the mean idf, as rank_bm25."""
        n = len(self.tf)
        if self._floor is None or self._floor[0] != n:  # one pass over the vocabulary per new text, not per query
            self._sync_vocab()
            # The same sum over the sorted vocabulary as ever, but each word's term looked up by its
            # document frequency: a handful of distinct values, so two logs per value, not per word;
            # and the words' terms gathered by numpy from `_dfs` (kept in step by `add`), not by a
            # Python pass of two dict lookups a word, which grew with every text memory holds.
            dfs = self._dfs
            total = 0.0
            if len(dfs):
                table = np.zeros(int(dfs.max()) + 1)
                for d in np.flatnonzero(np.bincount(dfs)).tolist():
                    table[d] = _idf_term(n, d)
                total = _sequential_sum(table[dfs])
            self._floor = (n, self.EPSILON * total / len(self.df) if self.df else 0.0)
        return self._floor

    def scores(self, query: str, keys: list[str]) -> list[float]:
        """BM25 of each stored text in `keys` for the query text."""
        if not self.tf:
            return [0.0 for _ in keys]
        n = len(self.tf)
        floor = None  # needed only when a query word occurs in more than half the texts (a negative idf)
        if not self.total_len:  # every stored text is empty (all its words withheld): no word can match
            return [0.0 for _ in keys]
        avgdl = self.total_len / n
        q = self.words(query)
        # Each query word's idf once per query, not once per key (the same floats: the same expression).
        idfs = {w: _idf_term(n, d) for w in q if (d := self.df.get(w))}
        q = [w for w in q if w in idfs]  # a word no text holds adds nothing to any score: not looked up per key
        out = []
        for key in keys:
            freq = self.tf.get(key)
            if freq is None:
                out.append(0.0)
                continue
            norm = self.K1 * (1 - self.B + self.B * self.dl[key] / avgdl)
            score = 0.0
            for w in q:  # repeated query words count again, as rank_bm25's do
                f = freq.get(w, 0)
                if not f:
                    continue
                idf = idfs[w]
                if idf < 0:
                    if floor is None:
                        floor = self._idf()[1]
                    idf = floor
                score += idf * f * (self.K1 + 1) / (f + norm)
            out.append(score)
        return out


def _sequential_sum(values: np.ndarray) -> float:
    """`sum(values.tolist())`, the float Python's built-in sum gives: on Python 3.11 a plain running sum,
    which numpy's cumulative sum computes in the same order and to the same bits; from 3.12 on, sum()
    compensates its rounding, so there it is called as before."""
    if sys.version_info < (3, 12):
        return float(np.cumsum(values)[-1])
    return sum(values.tolist())
