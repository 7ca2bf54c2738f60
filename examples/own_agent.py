"""Your own agent, grandrounds' memory: a plain loop with the `openai` client, memory through the Python API.

    python examples/own_agent.py --base-url http://127.0.0.1:8080/v1 --model MODEL --db own.duckdb

Any OpenAI-compatible server works (vLLM, Ollama, LM Studio, OpenAI). For each case: recall memory, put its
text in front of the prompt, ask the model, record its answer, then give the gold answer as feedback.
The session is an ordinary run: `grandrounds verify --db own.duckdb NAMESPACE` re-executes it from the
recorded replies, without the model.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from openai import OpenAI

from grandrounds import Memory

SYSTEM = ("You are a clinical reasoning agent. Answer the multiple-choice case with one option letter, as "
          "<response>X</response>. Available tools: none")


def ask(client: OpenAI, model: str, memory_text: str, case: dict) -> tuple[str, str, dict | None]:
    """(answer letter, the model's text, token usage)."""
    options = "\n".join(f"{k}) {v}" for k, v in sorted(case["options"].items()))
    prompt = f"{memory_text}\n\n## Case\n{case['question']}\n\nOptions:\n{options}"
    reply = client.chat.completions.create(model=model, temperature=0, max_tokens=256,
                                           messages=[{"role": "system", "content": SYSTEM},
                                                     {"role": "user", "content": prompt}])
    text = reply.choices[0].message.content or ""
    found = re.search(r"<response>\s*([A-Z])\s*</response>", text)
    usage = reply.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"}) \
        if reply.usage else None
    return (found.group(1) if found else "?"), text, usage  # "?" is recorded as no answer, never a guess


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="not-needed")
    parser.add_argument("--db", default="own.duckdb")
    parser.add_argument("--namespace", default="own-agent")
    parser.add_argument("--cases", default=str(Path(__file__).with_name("cases.jsonl")))
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()

    cases = [json.loads(line) for line in Path(args.cases).read_text(encoding="utf-8").splitlines() if line.strip()]
    cases = cases[: args.limit]
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    correct = 0
    with Memory.open(args.db, namespace=args.namespace, agent=args.model, cases=len(cases)) as memory:
        for case in cases:
            gold = case.pop("answer")  # the agent never sees it
            shown = memory.recall(case)
            answer, text, usage = ask(client, args.model, shown.text, case)
            memory.record(case["case_id"], answer, steps=[{"kind": "response", "content": text}], usage=usage)
            result = memory.feedback(case["case_id"], outcome=gold)
            correct += result.correct
            print(f"{case['case_id']}: {answer} ({'right' if result.correct else 'wrong'}), "
                  f"{len(shown.items)} items shown, {len(result.changes)} memory changes")
        verified = memory.verify()
    print(json.dumps({"namespace": args.namespace, "cases": len(cases), "correct": correct,
                      "fingerprint": verified["fingerprint"], "verified": verified["ok"]}))


if __name__ == "__main__":
    main()
