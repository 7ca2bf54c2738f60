"""Evo-MedAgent's memory mechanisms (seed 003; parameters in DESIGN §6).

Pure functions over the memory state: rule utility with its exploration bonus, the
composite selection score, tool trust labels, near-duplicate detection, and the context
prefix in the paper's order (base protocol, governance, rules, episodes).
"""

from __future__ import annotations

import math

from handlers.policies.config import EvoMedAgentPolicy
from store.event_types import RetrievedEpisode, RetrievedRule, ToolGuidance
from store.memory_state import Rule, ToolRecord

BASE_PROTOCOL = (
    "You are a clinical reasoning agent. Read the case, weigh the evidence, use tools only "
    "as their governance label allows, and answer with exactly one option letter."
)


def rule_utility(rule: Rule, total_feedback: int, cfg: EvoMedAgentPolicy) -> float:
    """Success rate plus a UCB-style exploration bonus; untested rules get a fixed optimism.

    N is the number of cases with feedback so far and n the rule's selections — the
    published code's reading of the paper's "bonus for under-tested rules".
    """
    if rule.selected == 0:
        return cfg.untested_utility
    success = rule.helpful / rule.selected
    bonus = cfg.exploration_c * math.sqrt(math.log(total_feedback + 1) / (rule.selected + 1))
    return success + bonus


def selection_score(relevance: float, utility: float, priority: int, cfg: EvoMedAgentPolicy) -> float:
    return (cfg.w_relevance * relevance + cfg.w_utility * utility
            + cfg.w_priority * cfg.priority_bonus[priority])


def tool_label(rec: ToolRecord, cfg: EvoMedAgentPolicy) -> str:
    """Trusted: n ≥ 6, helpful rate > 0.70, no harm. Avoid: n ≥ 10, (n⁻ + 0.5·nᵐ)/n > 0.60."""
    n = rec.total
    if n >= cfg.trusted_min_uses and rec.helpful / n > cfg.trusted_helpful_rate and rec.harmful == 0:
        return "Trusted"
    if n >= cfg.avoid_min_uses and (rec.harmful + cfg.misuse_weight * rec.misuse) / n > cfg.avoid_bad_rate:
        return "Avoid"
    return "Caution"


def escalated(priority: int) -> int:
    """One step more urgent (0 is the most urgent)."""
    return max(0, priority - 1)


def demoted(priority: int) -> int:
    return min(2, priority + 1)


_GUIDANCE_TEXT = {
    "Trusted": "reliable so far; use its output",
    "Caution": "mixed or little evidence; corroborate its output",
    "Avoid": "unreliable; do not call it",
}


def render_prefix(guidance: list[ToolGuidance], rules: list[RetrievedRule],
                  episodes: list[RetrievedEpisode]) -> str:
    parts = ["## Protocol", BASE_PROTOCOL]
    if guidance:
        parts.append("## Tool governance")
        parts += [f"- {g.tool}: {g.label} — {_GUIDANCE_TEXT[g.label]}" for g in guidance]
    if rules:
        parts.append("## Procedural rules (priority 0 = most urgent)")
        parts += [f"- [P{r.priority}] {r.text}" for r in rules]
    if episodes:
        parts.append("## Similar past cases")
        parts += [f"- {e.summary} Guideline: {e.guideline}" for e in episodes]
    return "\n".join(parts)
