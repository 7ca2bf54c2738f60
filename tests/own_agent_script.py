"""A scripted agent for the own-agent tests: its reply is a function of what it is shown (the case and the
recalled memory), so `grandrounds run --agent own_agent_script:agent`, the Python API, HTTP and MCP all get
the same replies for the same cases and memory — the premise of comparing their fingerprints."""

from __future__ import annotations

from grandrounds.handlers.backbones.agent import AgentReply


def scripted(options: dict[str, str], items: list[dict]) -> dict:
    """The reply to a case with these options after this memory: the option an item names (the first such
    item is credited), else the last option; steps and usage included, so they are recorded too."""
    for item in items:
        for letter, text in sorted(options.items()):
            if text.lower() in item["text"].lower():
                return {"answer": letter, "used": [item["ref"]],
                        "steps": [{"kind": "reasoning", "content": f"{item['ref']} names {letter}"}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}
    letter = sorted(options)[-1]
    return {"answer": letter, "steps": [{"kind": "reasoning", "content": "no memory item names an option"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}


def agent(case, memory) -> AgentReply:
    return AgentReply.model_validate(scripted(case.options, [i.model_dump() for i in memory.items]))


async def async_agent(case, memory) -> AgentReply:
    return agent(case, memory)


def letter_agent(case, memory) -> str:
    """The plainest agent: an option letter."""
    return sorted(case.options)[0]
