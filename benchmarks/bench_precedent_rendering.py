"""How should a precedent be chosen and shown to a small model? Each held-out case answered once per rendering.

The exploration behind evo-medagent's and precedent's small-model settings (README, *Choosing and
showing the precedent*). Memory is the training stream with its confirmed answers
(examples/recurring_train.jsonl); each held-out case (examples/recurring_test.jsonl) is sent once per
rendering to an OpenAI-compatible server with the exact prompt the schema agent sends
(`SCHEMA_SYSTEM`, `task_prompt`, `render`, the constrained answer schema), and the answer is the
schema's letter. No event log: this compares renderings, `bench_real_model.py` measures the policies
end to end. Renderings (`--renderings`, comma-separated):

- `none`: no precedent (the memory-free prompt);
- `letter`: the two nearest training cases by cosine (>= 0.5), "Confirmed diagnosis: X (option B in
  this question)" (the rendering before, cosine and two precedents, is the recorded `precedent`
  frozen run of bench_real_model.py: 20/28);
- `overlap1`: the 8 nearest by cosine re-ordered by an idf-weighted word overlap, the first one,
  with the option letter;
- `bm25`: as overlap1 with BM25 (`TermIndex`) as the overlap: what the policies now do.

    python benchmarks/bench_precedent_rendering.py --base-url http://127.0.0.1:8080/v1 \\
        --model qwen2.5-coder-1.5b-instruct [--renderings none,letter,overlap1,bm25] [--limit N] [--json OUT]

A 1.5 B coder model: its scores compare renderings; they are not a clinical claim.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import urllib.request
from pathlib import Path

import numpy as np

from grandrounds.handlers.agent.actions import mcq_action_schema, response_format
from grandrounds.handlers.agent.guard import GuardConfig, render
from grandrounds.handlers.agent.react import SCHEMA_SYSTEM, task_prompt
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.policies.precedents import findings_of, option_note
from grandrounds.handlers.policies.render import BASE_PROTOCOL, render_prefix
from grandrounds.handlers.text import TermIndex, content_tokens
from grandrounds.store.embeddings import shared_minilm
from grandrounds.store.event_types import MemoryRetrieved

ROOT = Path(__file__).resolve().parent.parent
RENDERINGS = ("none", "letter", "overlap1", "bm25")


class Memory:
    def __init__(self, train) -> None:
        self.train = train
        self.embedder = shared_minilm()
        self.vectors = np.stack([self._unit(c.question) for c in train])
        self.words = [content_tokens(c.question) for c in train]
        df: dict[str, int] = {}
        for ws in self.words:
            for w in ws:
                df[w] = df.get(w, 0) + 1
        self.idf = {w: math.log((len(train) + 1) / (n + 0.5)) for w, n in df.items()}
        self.bm25 = TermIndex()
        for c in train:
            self.bm25.add(c.case_id, c.question)

    def _unit(self, text: str) -> np.ndarray:
        v = self.embedder.embed_one(text)
        return v / np.linalg.norm(v)

    def overlap(self, q: set[str], j: int) -> float:
        d = self.words[j]
        norm = math.sqrt(sum(self.idf.get(w, 0) ** 2 for w in sorted(q))) * math.sqrt(
            sum(self.idf[w] ** 2 for w in sorted(d)))
        return sum(self.idf.get(w, 0) for w in sorted(q & d)) / (norm + 1e-9)

    def nearest(self, question: str, rendering: str, floor: float = 0.5) -> list[int]:
        sims = self.vectors @ self._unit(question)
        order = [int(i) for i in np.argsort(-sims) if sims[i] >= floor]
        if rendering == "letter":
            return order[:2]
        pool = order[:8]
        if rendering == "overlap1":
            q = content_tokens(question)
            pool.sort(key=lambda j: -self.overlap(q, j))
        else:
            scores = self.bm25.scores(question, [self.train[j].case_id for j in pool])
            pool = [pool[i] for i in sorted(range(len(pool)), key=lambda i: (-scores[i], i))]
        return pool[:1]


def letter_note(gold_text: str, options: dict[str, str]) -> str:
    """As the policies' `option_note`, in the experiment's words for an answer that is not an option."""
    note = option_note(gold_text, options)
    return " (not an option here)" if note.startswith(" (not among") else note


def prefix(memory: Memory, case, rendering: str) -> str:
    if rendering == "none":
        return render_prefix([], [], [])
    picks = [memory.train[j] for j in memory.nearest(case.question, rendering)]
    if not picks:
        return render_prefix([], [], [])
    lines = [f"- Past case: {findings_of(p.question)} Confirmed diagnosis: {p.options[p.answer]}"
             f"{letter_note(p.options[p.answer], case.options)}." for p in picks]
    return "\n".join(["## Protocol", BASE_PROTOCOL, "## Similar past cases (findings and confirmed diagnosis)", *lines,
                      "Compare this case's findings with each past case: where they match, the confirmed "
                      "diagnosis is strong evidence."])


def ask(base_url: str, model: str, case, memory_prefix: str) -> str | None:
    view = case.view()
    mem = MemoryRetrieved(memory_seq=0, prefix=memory_prefix)
    system = SCHEMA_SYSTEM.format(max_steps=7, tools="none — give your answer.", tool_example="tool name")
    body = {"model": model, "messages": render(system, task_prompt(view, mem), [], 1, False, GuardConfig()),
            "temperature": 0.0, "max_tokens": 1024,
            "response_format": response_format(mcq_action_schema(list(view.options), []))}
    req = urllib.request.Request(f"{base_url.rstrip('/')}/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    reply = json.loads(urllib.request.urlopen(req, timeout=1800).read())["choices"][0]["message"]["content"]
    try:
        return json.loads(reply)["action"]["answer"]
    except (ValueError, KeyError, TypeError):
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--renderings", default="letter,overlap1,bm25")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--json", dest="json_out", type=Path, default=None)
    a = ap.parse_args()
    renderings = a.renderings.split(",")
    unknown = [r for r in renderings if r not in RENDERINGS]
    if unknown:
        ap.error(f"--renderings: unknown {unknown} (known: {', '.join(RENDERINGS)})")
    train = load_cases(str(ROOT / "examples" / "recurring_train.jsonl"))[0]
    test = load_cases(str(ROOT / "examples" / "recurring_test.jsonl"))[0][: a.limit]
    memory = Memory(train)
    results: dict[str, list[dict]] = {}
    for r in renderings:
        rows = results[r] = []
        for case in test:
            answer = ask(a.base_url, a.model, case, prefix(memory, case, r))
            rows.append({"case_id": case.case_id, "answer": answer, "gold": case.answer})
            print(f"{r} {case.case_id} {answer} {case.answer}", file=sys.stderr, flush=True)
        print(f"| {r} | {sum(x['answer'] == x['gold'] for x in rows)}/{len(rows)} |", flush=True)
    if a.json_out:
        tmp = a.json_out.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1) + "\n")
        tmp.replace(a.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
