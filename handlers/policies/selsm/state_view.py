"""What of a SELSM state the embedder sees: a bounded slice that fits its window (issue 44, part 1).

A state s_t is the query plus one line per step taken (handlers/agent/step_memory.py `agent_state`). After
one FHIR response it runs to ~700 wordpieces, and all-MiniLM-L6-v2 reads 256 (store/wordpieces.py): every
state past the first response embedded as the same prefix, so stage 2 could not tell two workflows' later
steps apart (θ filtered nothing; the tie-break returned the latest round). The paper embeds s_t whole with
an embedder that reads it whole; this view keeps what tells states apart inside the window we have:

- the query, cut to `QUERY_PIECES` (the task: stage 1 already anchored on it, so its head suffices);
- the latest steps, newest kept first and shown in order, each as `step t: ACTION -> OBSERVATION` with the
  action cut to `ACTION_PIECES` and the observation to `OBSERVATION_PIECES` (a FHIR bundle's head says
  what came back; the action says what was asked, which is what differs between workflows);
- a line `(k earlier steps)` where older steps did not fit.

The whole is at most `wordpieces.text_budget()` pieces (254), checked by re-tokenizing. The stored state
(`StoredTransition.state`) stays whole: the view is only what is embedded, on both sides (stored states
in memory.py, the live state in policy.py), as `state_view = 2` of the policy records; runs recorded
before it embedded the whole text (`state_view = 1`) and re-execute so.
"""

from __future__ import annotations

from functools import lru_cache

from grandrounds.store import wordpieces

QUERY_PIECES = 96
ACTION_PIECES = 40
OBSERVATION_PIECES = 24
WHOLE, WINDOWED = 1, 2
"""`SelsmPolicy.state_view`: 1 embeds the state text as it is (runs before issue 44); 2 this view."""


def split_state(state: str) -> tuple[str, list[tuple[str, str]]]:
    """(query, [(action, observation), ...]) from `agent_state`'s text: step t's line starts with
    "\\nstep t: " (t = 1, 2, ... in turn, so a query or observation quoting "step 9:" is not a step), and its
    action ends at the first " -> " (actions are "call NAME", "answer X", "GET URL", "POST URL {...}")."""
    marks, pos = [], 0
    for t in range(1, 10_000):
        at = state.find(f"\nstep {t}: ", pos)
        if at < 0:
            break
        marks.append((at, at + len(f"\nstep {t}: ")))
        pos = marks[-1][1]
    if not marks:
        return state, []
    query = state[:marks[0][0]]
    steps = []
    for i, (_, start) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else len(state)
        action, _, observation = state[start:end].partition(" -> ")
        steps.append((action, observation))
    return query, steps


@lru_cache(maxsize=4096)  # the fit below renders the same steps at several widths; each cut tokenizes
def _line(t: int, action: str, observation: str, observation_pieces: int) -> str:
    # Whitespace folded (a pretty-printed JSON body on one line: the same pieces, fewer characters).
    act = wordpieces.cut(" ".join(action.split()), ACTION_PIECES)
    obs = wordpieces.cut(" ".join(observation.split()), observation_pieces)
    return f"step {t}: {act} -> {obs}"


def _render(head: str, steps: list[tuple[str, str]], first: int, observation_pieces: int) -> str:
    earlier = [f"({first - 1} earlier step{'s' if first > 2 else ''})"] if first > 1 else []
    lines = [_line(t, *steps[t - 1], observation_pieces) for t in range(first, len(steps) + 1)]
    return "\n".join([head, *earlier, *lines])


def embedded_state(state: str, view: int = WINDOWED) -> str:
    """The text of `state` the embedder is given under `view` (see the module)."""
    if view == WHOLE:
        return state
    budget = wordpieces.text_budget()
    if wordpieces.count(state) <= budget:
        return state  # it fits: embedded whole, as the paper does
    query, steps = split_state(state)
    head = wordpieces.cut(query.strip(), QUERY_PIECES)
    if not steps:
        return wordpieces.cut(head, budget - 1)
    # The latest steps that fit at the shortest observations, newest first (at least the latest one).
    first = len(steps)
    while first > 1 and wordpieces.count(_render(head, steps, first - 1, OBSERVATION_PIECES)) <= budget:
        first -= 1
    # What the window has left goes to those steps' observations, evenly (more of each response).
    text = _render(head, steps, first, OBSERVATION_PIECES)
    spare = budget - wordpieces.count(text)
    per = OBSERVATION_PIECES + max(0, spare) // (len(steps) - first + 1)
    while per > OBSERVATION_PIECES:
        wider = _render(head, steps, first, per)
        if wordpieces.count(wider) <= budget:
            text = wider
            break
        per -= 4
    while wordpieces.count(text) > budget:  # a single step longer than the rest of the window
        text = wordpieces.cut(text, budget - (wordpieces.count(text) - budget) - 1)
    return text
