"""Stage 4, reflect: the backbone proposes patch-style edits; the policy turns them into memory events.

Near-duplicates (cosine ≥ 0.85 to an active rule) escalate the existing rule's priority
instead of adding a copy, as Evo-MedAgent prescribes.
"""

from __future__ import annotations

from handlers.backbones.base import CaseFailure, records_exchanges
from handlers.cases import Case
from handlers.context import RunContext
from handlers.llm.recorder import stage_recorder
from handlers.policies.config import EvoMedAgentPolicy
from handlers.policies.evo_medagent import escalated
from store.event_types import (AnswerGiven, EpisodeStored, FeedbackRecorded, MemoryRetrieved,
                               ReflectionRecorded, RuleAdded, RuleEdited, RuleEditProposal,
                               RulePriorityChanged, RuleRetired)
from store.llm_events import CaseFailed


async def reflect(ctx: RunContext, case: Case, memory: MemoryRetrieved, answer: AnswerGiven,
                  fb: FeedbackRecorded) -> ReflectionRecorded | CaseFailed | None:
    policy = ctx.policy
    if not (isinstance(policy, EvoMedAgentPolicy) and policy.writing):
        return None
    extra = ({"recorder": stage_recorder(ctx.writer, case.case_id, "reflect")}
             if records_exchanges(ctx.backbone) else {})
    try:
        result = await ctx.backbone.reflect(case, memory, answer, fb, **extra)
    except CaseFailure as exc:  # nothing is written to memory from a reflection that failed
        failed = CaseFailed(stage="reflect", reason=exc.reason, steps=exc.steps)
        ctx.writer.emit(failed, case_id=case.case_id)
        return failed
    cause = ctx.writer.emit(result, case_id=case.case_id)
    state = ctx.projection.state
    if policy.episodic:
        trace = [f"{s.kind}: {s.content}" for s in answer.steps]
        ctx.writer.emit(EpisodeStored(
            episode_id=f"ep-{state.episodes_added:05d}", case_id=case.case_id, descriptor=case.question,
            trace=trace, answer=answer.answer, gold=case.answer, correct=fb.correct,
            summary=result.summary, guideline=result.guideline,
            trigger=_trigger_of(result, case)), case_id=case.case_id, causation_seq=cause)
    if policy.procedural:
        for edit in result.edits:
            _apply_edit(ctx, policy, case, edit, cause)
    return result


def _trigger_of(result: ReflectionRecorded, case: Case) -> list[str]:
    added = next((e.trigger for e in result.edits if e.trigger), None)
    if added is not None:
        return list(added)
    from handlers.text import key_terms

    return key_terms(case.question)


def _apply_edit(ctx: RunContext, cfg: EvoMedAgentPolicy, case: Case, edit: RuleEditProposal, cause: int) -> None:
    state, emit = ctx.projection.state, ctx.writer.emit
    cid = case.case_id
    rule = state.rules.get(edit.rule_id) if edit.rule_id else None
    if edit.op == "add":
        if not edit.text:
            return
        duplicate = _near_duplicate(ctx, cfg, edit.text)
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


def _near_duplicate(ctx: RunContext, cfg: EvoMedAgentPolicy, text: str):
    proj = ctx.projection
    if not len(proj.rule_index):
        return None
    hits = proj.rule_index.search(proj.embed(text), 1)
    if hits and hits[0][1] >= cfg.duplicate_cosine:
        return proj.state.rules[proj.rule_by_label[hits[0][0]]]
    return None
