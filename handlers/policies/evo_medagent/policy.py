"""Evo-MedAgent's memory (seed 003; parameters in DESIGN §6).

Episodic memory E (whole cases with summary and guideline), procedural rules S (priority,
exploration-bonus utility, patch-style edits, near-duplicate escalation) and tool
governance G (Trusted / Caution / Avoid from helpful / harmful / misuse counts). Pure
scoring functions first, then `EvoMedAgentMemory`, the stage-facing mechanism.
"""

from __future__ import annotations

from typing import Iterable
from grandrounds.store.case_content import own_set
import math  # sqrt only: IEEE 754 makes it correctly rounded; ln goes through exact_math

import numpy as np

from grandrounds.handlers.llm.errors import CaseFailure
from grandrounds.handlers.cases import Case
from grandrounds.handlers.llm.recorder import records_exchanges, stage_recorder
from grandrounds.handlers.policies.base import MemoryPolicy
from grandrounds.handlers.policies.config import EvoMedAgentPolicy
from grandrounds.handlers.text import key_terms
from grandrounds.handlers.policies.precedents import (findings_of, precedent_line, review_text, rule_matches,
                                                      unconfirmed_lesson)
from grandrounds.handlers.policies.render import BASE_PROTOCOL, render_prefix  # noqa: F401  (re-exported)
from grandrounds.handlers.policies.evo_medagent.events import (EpisodeStored, RuleAdded, RuleEdited, RulePriorityChanged,
                                                            RuleRetired, ToolLabelChanged)
from grandrounds.handlers.policies.evo_medagent.memory import EvoMemory, Rule, ToolRecord
from grandrounds.handlers.text import content_tokens
from grandrounds.store import exact_math
from grandrounds.store.event_types import (AnswerGiven, FeedbackRecorded, MemoryRetrieved, ReflectionRecorded,
                                           RetrievedEpisode, RetrievedRule, RuleEditProposal, RuleOutcome, ToolCall,
                                           ToolGuidance, ToolOutcome)
from grandrounds.store.llm_events import CaseFailed
from grandrounds.store.projection import MemoryProjection


def evo_memory(proj: MemoryProjection) -> EvoMemory:
    """The run's Evo-MedAgent memory part (registered for evo-medagent, precedent and none)."""
    part = proj.state.policy_memory
    assert isinstance(part, EvoMemory), f"the run's memory is a {type(part).__name__}, not Evo-MedAgent's"
    return part


def rule_utility(rule: Rule, total_feedback: int, cfg: EvoMedAgentPolicy) -> float:
    """Success rate plus a UCB-style exploration bonus; untested rules get a fixed optimism.

    N is the number of cases with feedback so far and n the rule's selections — the
    published code's reading of the paper's "bonus for under-tested rules".
    """
    return _utility(rule.selected, rule.helpful, exact_math.ln(total_feedback + 1), cfg.exploration_c,
                    cfg.untested_utility)


def _utility(selected: int, helpful: int, log_n1: float, c: float, untested: float) -> float:
    """`rule_utility` with log(N + 1) taken once per retrieval (the same float: selection scores
    up to 32 candidates a case, and the log is the same for all of them)."""
    if selected == 0:
        return untested
    return helpful / selected + c * math.sqrt(log_n1 / (selected + 1))


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


def tool_outcome(call: ToolCall, gold: str) -> str:
    """helpful: pointed at the gold option; harmful: asserted a wrong option;
    misuse: called although governance said Avoid; neutral: returned nothing usable."""
    if call.label == "Avoid":
        return "misuse"
    if call.output is None:
        return "neutral"
    return "helpful" if call.output == gold else "harmful"


def _r6(x: float) -> float:
    return round(float(x), 6)


def select_rules(proj: MemoryProjection, cfg: EvoMedAgentPolicy, own: str | Iterable[str], query: np.ndarray,
                 case_tokens: set[str] | None = None):
    """Top rules by Evo-MedAgent's composite score among the nearest `candidate_pool` by cosine.

    Returns (rule, relevance, utility, score) tuples, best first; ties by creation order.
    """
    if cfg.top_k_rules <= 0:
        return []
    state, own = evo_memory(proj), own_set(own)
    rules, by_label = state.rules, state.rule_by_label
    log_n1, c, untested = exact_math.ln(state.feedback_count + 1), cfg.exploration_c, cfg.untested_utility
    w_rel, w_util, w_prio, bonus = cfg.w_relevance, cfg.w_utility, cfg.w_priority, cfg.priority_bonus
    # Score every candidate first (the arithmetic of `selection_score`, inlined: the same float
    # operations in the same order), then walk them best first and apply the guards only until
    # top_k_rules have passed. Each guard looks at one rule alone, so filtering before or after
    # the sort selects the same rules in the same order; checking 5-6 instead of 32 is the saving.
    scored = []
    for i, (label, relevance) in enumerate(state.rule_index.search(query, cfg.candidate_pool)):
        rule = rules[by_label[label]]
        utility = _utility(rule.selected, rule.helpful, log_n1, c, untested)
        score = w_rel * relevance + w_util * utility + w_prio * bonus[rule.priority]
        scored.append((-score, rule.created_seq, i, rule, relevance, utility))
    scored.sort()  # best first, ties by creation order; `i` is unique, so no rule is ever compared
    out = []
    floor = cfg.rule_floor if case_tokens is not None else 0
    for neg, _, _, rule, relevance, utility in scored:
        if not own.isdisjoint(rule.derived_from):  # leakage guard: the case, or a case of the same content
            continue
        if floor > 0 and not rule_matches(rule.trigger, rule.text, case_tokens, floor):
            continue  # its trigger does not match this case: not shown, however high its utility
        out.append((rule, relevance, utility, -neg))
        if len(out) == cfg.top_k_rules:
            break
    return out


def select_episodes(proj: MemoryProjection, cfg: EvoMedAgentPolicy, own: str | Iterable[str], query: np.ndarray,
                    floor: float = -1.0, rerank_text: str | None = None):
    """Top episodes by cosine at or above the floor, excluding the case's own (and its content twins'):
    (episode, relevance) tuples. `rerank_text` (MCQ cases, `episode_rerank` > 0): the nearest
    `episode_rerank` are re-ranked by BM25 over that text's findings before K_E are taken."""
    return evo_memory(proj).nearest_episodes(query, own_set(own), floor, cfg.top_k_episodes,
                                             cfg.episode_rerank, rerank_text)


def evo_retrieve(proj: MemoryProjection, cfg: EvoMedAgentPolicy, case: Case, memory_seq: int,
                 question: str | None = None) -> MemoryRetrieved:
    """`question`: the case's question as retrieval reads it (de-identified, `RunContext.retrieval_text`)."""
    state = evo_memory(proj)
    query = proj.embed(case.question if question is None else question)
    own = proj.own_cases(case.case_id)  # leakage guard: the case and its content twins
    mcq = case.kind == "mcq"  # the floors are for MCQ cases (FHIR tasks and OSCE dialogues keep the paper's retrieval)

    rules: list[RetrievedRule] = []
    if cfg.procedural and cfg.top_k_rules and len(state.rule_index):
        rules = [RetrievedRule(rule_id=r.rule_id, text=r.text, trigger=r.trigger, priority=r.priority,
                               relevance=_r6(rel), utility=_r6(u), score=_r6(s))
                 for r, rel, u, s in select_rules(proj, cfg, own, query,
                                                  content_tokens(case.question) if mcq else None)]

    episodes: list[RetrievedEpisode] = []
    precedents: list[str] = []
    if cfg.episodic and cfg.top_k_episodes and len(state.episode_index):
        for ep, rel in select_episodes(proj, cfg, own, query, cfg.episode_floor if mcq else -1.0,
                                       (case.question if question is None else question) if mcq else None):
            episodes.append(RetrievedEpisode(episode_id=ep.episode_id, source_case_id=ep.case_id, summary=ep.summary,
                                             guideline=ep.guideline, trigger=ep.trigger, relevance=_r6(rel)))
            precedents.append(episode_precedent(ep, cfg.name_wrong_answers, cfg.precedent_style,
                                                getattr(case, "options", None) if mcq else None))

    guidance = [ToolGuidance(tool=name, label=state.tools[name].label) for name in sorted(state.tools)]
    return MemoryRetrieved(memory_seq=memory_seq, rules=rules, episodes=episodes, tool_guidance=guidance,
                           prefix=render_prefix(guidance, rules, episodes, precedents))


def episode_precedent(ep, name_wrong: bool = False, style: int = 1, options: dict[str, str] | None = None) -> str:
    """An episode as a precedent when it knows its options' texts (MCQ); else the paper's summary line."""
    if not ep.gold_text:
        return f"- {ep.summary} Guideline: {ep.guideline}"
    return precedent_line(findings_of(ep.descriptor), ep.gold_text, ep.answer_text, ep.correct, ep.guideline,
                          name_wrong, style, options)


class EvoMedAgentMemory(MemoryPolicy):
    config: EvoMedAgentPolicy

    def retrieve(self, ctx, case, memory_seq):
        return evo_retrieve(ctx.projection, self.config, case, memory_seq,
                            ctx.retrieval_text(case.question, case.case_id))

    def outcomes(self, ctx, case, memory, answer, correct):
        if not self.writes:
            return [], []
        rules = [RuleOutcome(rule_id=r.rule_id, helpful=correct) for r in memory.rules]
        tools = ([ToolOutcome(tool=c.tool, outcome=tool_outcome(c, case.answer)) for c in answer.tool_calls]
                 if self.config.governance else [])
        return rules, tools

    async def reflect(self, ctx, case: Case, memory: MemoryRetrieved, answer: AnswerGiven,
                      fb: FeedbackRecorded) -> ReflectionRecorded | CaseFailed | None:
        """The backbone proposes patch-style edits; they become memory events here. Near-duplicates
        (cosine ≥ 0.85 to an active rule) escalate the existing rule's priority instead of adding a copy."""
        cfg = self.config
        if not self.writes:
            return None
        extra = ({"recorder": stage_recorder(ctx.writer, case.case_id, "reflect")}
                 if records_exchanges(ctx.backbone) else {})
        try:
            result = await ctx.backbone.reflect(case, memory, answer, fb, **extra)
        except CaseFailure as exc:  # no lesson from a reflection that failed; the case itself is still known
            failed = CaseFailed(stage="reflect", reason=exc.reason, steps=exc.steps)
            cause = ctx.writer.emit(failed, case_id=case.case_id)
            if cfg.episodic and cfg.episode_without_reflection:
                self._store_episode(ctx, case, answer, fb, "", "", key_terms(case.question), cause)
            return failed
        rejected, review = self._review(case, result, fb.correct)
        if review:
            result = result.model_copy(update={"review": review})
        cause = ctx.writer.emit(result, case_id=case.case_id)
        if cfg.episodic:
            guideline = "" if "guideline" in rejected else result.guideline
            self._store_episode(ctx, case, answer, fb, result.summary, guideline, _trigger_of(result, case), cause)
        if cfg.procedural:
            for i, edit in enumerate(result.edits):
                if i not in rejected:
                    self._apply_edit(ctx, case, edit, cause)
        return result

    def _store_episode(self, ctx, case: Case, answer: AnswerGiven, fb: FeedbackRecorded, summary: str,
                       guideline: str, trigger: list[str], cause: int) -> None:
        state = evo_memory(ctx.projection)
        options = getattr(case, "options", None) if case.kind == "mcq" else None
        ctx.writer.emit(EpisodeStored(
            episode_id=f"ep-{state.episodes_added:05d}", case_id=case.case_id, descriptor=case.question,
            trace=[f"{s.kind}: {s.content}" for s in answer.steps], answer=answer.answer, gold=case.answer,
            correct=fb.correct, summary=summary, guideline=guideline, trigger=trigger,
            answer_text=options.get(answer.answer, "") if options else "",
            gold_text=options.get(case.answer, "") if options else ""), case_id=case.case_id, causation_seq=cause)

    def _review(self, case: Case, result: ReflectionRecorded, correct: bool = True) -> tuple[set, list[str]]:
        """The review gate (MCQ cases): edit indices and "guideline" kept out of memory, and why."""
        if not self.config.review_gate or case.kind != "mcq":
            return set(), []
        rejected: set = set()
        review: list[str] = []
        for i, edit in enumerate(result.edits):
            if edit.op in ("add", "edit") and edit.text:
                why = review_text(edit.text, case.question, case.options, case.answer)
                if why:
                    rejected.add(i)
                    review.append(f"edit {i}: {why}")
        why = review_text(result.guideline, case.question, case.options, case.answer) if result.guideline else None
        if why is None and result.guideline and self.config.strict_lessons and not correct:
            why = unconfirmed_lesson(result.guideline, case.options, case.answer)
        if why:
            rejected.add("guideline")
            review.append(f"guideline: {why}")
        return rejected, review

    def _apply_edit(self, ctx, case: Case, edit: RuleEditProposal, cause: int) -> None:
        state, emit = evo_memory(ctx.projection), ctx.writer.emit
        cid = case.case_id
        rule = state.rules.get(edit.rule_id) if edit.rule_id else None
        if edit.op == "add":
            if not edit.text:
                return
            duplicate = self._near_duplicate(ctx, edit.text)
            if duplicate is not None:
                if duplicate.priority > 0:
                    emit(RulePriorityChanged(rule_id=duplicate.rule_id, old=duplicate.priority,
                                             new=escalated(duplicate.priority), source_case_id=cid,
                                             reason=f"near-duplicate proposed: {edit.reason}"),
                         case_id=cid, causation_seq=cause)
                return
            emit(RuleAdded(rule_id=f"rule-{state.rules_added:05d}", text=edit.text, trigger=edit.trigger or [],
                           priority=edit.priority if edit.priority is not None else 1, source_case_id=cid),
                 case_id=cid, causation_seq=cause)
        elif rule is None or rule.status != "active":
            return  # the backbone named a rule that is not (or no longer) in memory: nothing to patch
        elif edit.op == "edit" and edit.text:
            emit(RuleEdited(rule_id=rule.rule_id, text=edit.text, trigger=edit.trigger or rule.trigger,
                            source_case_id=cid, reason=edit.reason), case_id=cid, causation_seq=cause)
        elif edit.op == "reprioritise" and edit.priority is not None and edit.priority != rule.priority:
            emit(RulePriorityChanged(rule_id=rule.rule_id, old=rule.priority, new=edit.priority,
                                     source_case_id=cid, reason=edit.reason), case_id=cid, causation_seq=cause)
        elif edit.op == "retire":
            emit(RuleRetired(rule_id=rule.rule_id, source_case_id=cid, reason=edit.reason),
                 case_id=cid, causation_seq=cause)

    def _near_duplicate(self, ctx, text: str) -> Rule | None:
        proj = ctx.projection
        mem = evo_memory(proj)
        if not len(mem.rule_index):
            return None
        hits = mem.rule_index.search(proj.embed(text), 1)
        if hits and hits[0][1] >= self.config.duplicate_cosine:
            return mem.rules[mem.rule_by_label[hits[0][0]]]
        return None

    async def govern(self, ctx, case, index, fb) -> None:
        """Relabel tools from their records."""
        if not (self.writes and self.config.governance):
            return
        state = evo_memory(ctx.projection)
        for name in sorted(state.tools):
            rec = state.tools[name]
            new = tool_label(rec, self.config)
            if new != rec.label:
                ctx.writer.emit(ToolLabelChanged(tool=name, old=rec.label, new=new, n=rec.total,
                                                 helpful=rec.helpful, harmful=rec.harmful, misuse=rec.misuse),
                                case_id=case.case_id)


def _trigger_of(result: ReflectionRecorded, case: Case) -> list[str]:
    added = next((e.trigger for e in result.edits if e.trigger), None)
    if added is not None:
        return list(added)
    from grandrounds.handlers.text import key_terms

    return key_terms(case.question)
