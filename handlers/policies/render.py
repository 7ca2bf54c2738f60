"""Rendering memory into the context prefix the agent reads.

Evo-MedAgent's order (base protocol, governance guidance, rules, episodes) is the frame;
the other policies add their items as titled sections after it. Rendering is the only
place memory becomes prompt text: the trajectory records item ids, not this block.
"""

from __future__ import annotations

from grandrounds.handlers.agent.protocol import BASE_PROTOCOL  # the agent's protocol line (re-exported here)
from grandrounds.store.event_types import MemoryItem, RetrievedEpisode, RetrievedRule, ToolGuidance


_GUIDANCE_TEXT = {
    "Trusted": "reliable so far; use its output",
    "Caution": "mixed or little evidence; corroborate its output",
    "Avoid": "unreliable; do not call it",
}


def render_prefix(guidance: list[ToolGuidance], rules: list[RetrievedRule],
                  episodes: list[RetrievedEpisode], precedents: list[str] | None = None) -> str:
    """`precedents`: the episodes' lines as rendered by the policy (past findings, confirmed answer);
    without them, each episode's summary and guideline (the paper's rendering)."""
    parts = ["## Protocol", BASE_PROTOCOL]
    if guidance:
        parts.append("## Tool governance")
        parts += [f"- {g.tool}: {g.label} — {_GUIDANCE_TEXT[g.label]}" for g in guidance]
    if rules:
        parts.append("## Procedural rules (priority 0 = most urgent)")
        parts += [f"- [P{r.priority}] {r.text}" for r in rules]
    if precedents:
        parts.append("## Similar past cases (precedents: findings and the confirmed answer)")
        parts += precedents
    elif episodes:
        parts.append("## Similar past cases")
        parts += [f"- {e.summary} Guideline: {e.guideline}" for e in episodes]
    return "\n".join(parts)


def render_items(sections: list[tuple[str, list[MemoryItem]]], guidance: list[ToolGuidance] | None = None) -> str:
    """The base protocol (and tool governance), then one titled section per non-empty item list."""
    text = render_prefix(guidance or [], [], [])
    parts = [text]
    for title, items in sections:
        if items:
            parts.append(f"## {title}")
            parts += [f"- {item.text}" for item in items]
    return "\n".join(parts)
