"""Stage 1, retrieve: take the case in and read memory for it (Evo-MedAgent selection)."""

from __future__ import annotations

import numpy as np

from handlers.cases import Case
from handlers.context import RunContext
from handlers.policies.config import EvoMedAgentPolicy
from handlers.policies.evo_medagent import render_prefix, rule_utility, selection_score
from store.projection import MemoryProjection
from store.event_types import CaseReceived, MemoryRetrieved, RetrievedEpisode, RetrievedRule, ToolGuidance


def _r6(x: float) -> float:
    return round(float(x), 6)


async def retrieve(ctx: RunContext, case: Case, index: int) -> MemoryRetrieved:
    memory_seq = ctx.projection.seq  # the memory version this case reads
    ctx.writer.emit(CaseReceived(index=index, case=case.model_dump(mode="json")), case_id=case.case_id)
    policy = ctx.policy
    if isinstance(policy, EvoMedAgentPolicy):
        result = _evo_retrieve(ctx, policy, case, memory_seq)
    else:
        result = MemoryRetrieved(memory_seq=memory_seq, prefix=render_prefix([], [], []))
    ctx.writer.emit(result, case_id=case.case_id)
    return result


def select_rules(proj: MemoryProjection, cfg: EvoMedAgentPolicy, case_id: str, query: np.ndarray):
    """Top rules by Evo-MedAgent's composite score among the nearest `candidate_pool` by cosine.

    Returns (rule, relevance, utility, score) tuples, best first; ties by creation order.
    """
    state = proj.state
    scored = []
    for label, relevance in proj.rule_index.search(query, cfg.candidate_pool):
        rule = state.rules[proj.rule_by_label[label]]
        if case_id in rule.derived_from:  # leakage guard
            continue
        utility = rule_utility(rule, state.feedback_count, cfg)
        scored.append((-selection_score(relevance, utility, rule.priority, cfg), rule.created_seq,
                       rule, relevance, utility))
    scored.sort(key=lambda t: (t[0], t[1]))
    return [(r, rel, u, -neg) for neg, _, r, rel, u in scored[: cfg.top_k_rules]]


def select_episodes(proj: MemoryProjection, cfg: EvoMedAgentPolicy, case_id: str, query: np.ndarray):
    """Top episodes by cosine, excluding the case's own: (episode, relevance) tuples."""
    out = []
    for label, relevance in proj.episode_index.search(query, cfg.top_k_episodes + 1):
        ep = proj.state.episodes[proj.episode_by_label[label]]
        if ep.case_id != case_id:  # leakage guard
            out.append((ep, relevance))
    return out[: cfg.top_k_episodes]


def _evo_retrieve(ctx: RunContext, cfg: EvoMedAgentPolicy, case: Case, memory_seq: int) -> MemoryRetrieved:
    proj = ctx.projection
    state = proj.state
    query = proj.embed(case.question)

    rules: list[RetrievedRule] = []
    if cfg.procedural and cfg.top_k_rules and len(proj.rule_index):
        rules = [RetrievedRule(rule_id=r.rule_id, text=r.text, trigger=r.trigger, priority=r.priority,
                               relevance=_r6(rel), utility=_r6(u), score=_r6(s))
                 for r, rel, u, s in select_rules(proj, cfg, case.case_id, query)]

    episodes: list[RetrievedEpisode] = []
    if cfg.episodic and cfg.top_k_episodes and len(proj.episode_index):
        episodes = [RetrievedEpisode(episode_id=ep.episode_id, source_case_id=ep.case_id, summary=ep.summary,
                                     guideline=ep.guideline, trigger=ep.trigger, relevance=_r6(rel))
                    for ep, rel in select_episodes(proj, cfg, case.case_id, query)]

    guidance = [ToolGuidance(tool=name, label=state.tools[name].label) for name in sorted(state.tools)]
    return MemoryRetrieved(memory_seq=memory_seq, rules=rules, episodes=episodes, tool_guidance=guidance,
                           prefix=render_prefix(guidance, rules, episodes))
