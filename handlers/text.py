"""Lexical helpers shared by the simulated backbone and rule triggers."""

from __future__ import annotations

import re

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
    return {t for t in tokens(text) if t not in STOPWORDS}


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
