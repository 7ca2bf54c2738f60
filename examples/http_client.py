"""A client of `grandrounds serve` (the HTTP API), in any language's terms: plain JSON over HTTP.

    GRANDROUNDS_API_TOKEN=secret grandrounds serve --db memory.duckdb &
    GRANDROUNDS_API_TOKEN=secret python examples/http_client.py --url http://127.0.0.1:8765

The "agent" here picks the option a recalled memory item names, else the last option: replace `choose`
with yours.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import httpx


def choose(options: dict[str, str], items: list[dict]) -> tuple[str, list[str]]:
    for item in items:
        for letter, text in sorted(options.items()):
            if text.lower() in item["text"].lower():
                return letter, [item["ref"]]
    return sorted(options)[-1], []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8765")
    parser.add_argument("--namespace", default="http-agent")
    parser.add_argument("--cases", default=str(Path(__file__).with_name("cases.jsonl")))
    parser.add_argument("--limit", type=int, default=10)
    args = parser.parse_args()

    cases = [json.loads(line) for line in Path(args.cases).read_text(encoding="utf-8").splitlines()
             if line.strip()][: args.limit]
    headers = {"Authorization": f"Bearer {os.environ['GRANDROUNDS_API_TOKEN']}"}
    ns = f"/v1/namespaces/{args.namespace}"
    with httpx.Client(base_url=args.url, headers=headers, timeout=120) as http:
        http.put(ns, json={"cases": len(cases)}).raise_for_status()
        correct = 0
        for case in cases:
            gold = case.pop("answer")
            shown = http.post(f"{ns}/recall", json=case).raise_for_status().json()
            answer, used = choose(case["options"], shown["items"])
            http.post(f"{ns}/record", json={"case_id": case["case_id"], "answer": answer, "used": used}) \
                .raise_for_status()
            result = http.post(f"{ns}/feedback", json={"case_id": case["case_id"], "outcome": gold}) \
                .raise_for_status().json()
            correct += result["correct"]
        verified = http.post(f"{ns}/verify").raise_for_status().json()
    print(json.dumps({"namespace": args.namespace, "cases": len(cases), "correct": correct,
                      "fingerprint": verified["fingerprint"], "verified": verified["ok"]}))


if __name__ == "__main__":
    main()
