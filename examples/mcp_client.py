"""An MCP client (the official `mcp` SDK) of `grandrounds mcp`: starts the server over stdio, as an MCP
host (Claude Desktop, an IDE, an agent framework) does, and drives cases through its tools.

    python examples/mcp_client.py --db memory.duckdb
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def choose(options: dict[str, str], items: list[dict]) -> tuple[str, list[str]]:
    for item in items:
        for letter, text in sorted(options.items()):
            if text.lower() in item["text"].lower():
                return letter, [item["ref"]]
    return sorted(options)[-1], []


async def drive(db: str, namespace: str, cases: list[dict]) -> dict:
    server = StdioServerParameters(command=sys.executable, args=[
        "-c", "from grandrounds.cli import main; main()", "mcp", "--db", db, "--namespace", namespace,
        "--cases", str(len(cases))])
    correct = 0
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for case in cases:
            gold = case.pop("answer")
            shown = (await session.call_tool("recall", {"case": case})).structured_content
            answer, used = choose(case["options"], shown["items"])
            await session.call_tool("record", {"case_id": case["case_id"], "answer": answer, "used": used})
            result = (await session.call_tool("feedback", {"case_id": case["case_id"], "outcome": gold}))
            correct += result.structured_content["correct"]
        explained = await session.call_tool("explain", {"case_id": cases[-1]["case_id"]})
    return {"namespace": namespace, "cases": len(cases), "correct": correct,
            "explained": not explained.is_error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="memory.duckdb")
    parser.add_argument("--namespace", default="mcp-agent")
    parser.add_argument("--cases", default=str(Path(__file__).with_name("cases.jsonl")))
    parser.add_argument("--limit", type=int, default=10)
    args = parser.parse_args()
    cases = [json.loads(line) for line in Path(args.cases).read_text(encoding="utf-8").splitlines()
             if line.strip()][: args.limit]
    print(json.dumps(asyncio.run(drive(args.db, args.namespace, cases))))


if __name__ == "__main__":
    main()
