"""SELSM, the stage-facing mechanism (seed 000; DESIGN §6).

- act: before every decision the agent loop calls `step_memory(state)`; query-anchored
  two-stage retrieval (retrieval.py) returns the top M logical skills for that state.
- reflect (gold visible): the graded trajectory plus K-1 sampled re-runs (the paper's
  training-phase collection, `collect_training_trajectories`) are judged step by step
  (judge.py); each skill passes the entity checker (entity_check.py) or is recorded as
  rejected; the accepted transitions of all samples form one record R = (query, transitions).
Nothing is retrieved at the case level (stage 1 of the pipeline shows the base protocol only):
the paper injects skills per decision, and that is what both agent loops do.
"""

from __future__ import annotations

from grandrounds.handlers.llm.errors import CaseFailure
from grandrounds.handlers.cases import Case, CaseView
from grandrounds.handlers.llm.recorder import records_exchanges, stage_recorder
from grandrounds.handlers.policies.base import MemoryPolicy, StepMemory, ask_or_fail
from grandrounds.handlers.policies.render import render_items
from grandrounds.handlers.policies.selsm.config import SelsmPolicy
from grandrounds.handlers.policies.selsm.entity_check import check_skill
from grandrounds.handlers.policies.selsm.judge import decisions_of, judge_task, judged_steps
from grandrounds.handlers.policies.selsm.state_view import embedded_state
from grandrounds.handlers.policies.selsm.retrieval import TransitionHit, candidate_records, state_only, two_stage
from grandrounds.handlers.randomness import case_rng
from grandrounds.handlers.tools import ToolBox
from grandrounds.store.event_types import AnswerGiven, FeedbackRecorded, MemoryItem, MemoryRetrieved
from grandrounds.store.llm_events import CaseFailed
from grandrounds.handlers.policies.selsm.events import (RecordStored, SkillRejected, StepLabelled, StoredTransition, TrajectoryJudged,
                                render_skill)
from grandrounds.handlers.policies.selsm.memory import SelsmMemory as SelsmMemoryPart

SKILL_KIND = "logical-skill"
"""`MemoryItem.kind` of injected skills (answers that follow one have source `logical-skill:<id>`)."""

STEP_NOTE = "Logical skills distilled from earlier cases are shown before each decision when one matches."


def _item(hit: TransitionHit) -> MemoryItem:
    t = hit.transition
    return MemoryItem(kind=SKILL_KIND, item_id=t.skill_id, text=render_skill(t.skill), trigger=list(t.skill.trigger),
                      relevance=hit.state_score, score=hit.state_score,
                      detail={"record_id": hit.record.record_id, "round": t.round, "label": t.skill.label,
                              "query_score": hit.query_score, "source_case_id": hit.record.source_case_id})


def part_of(ctx) -> SelsmMemoryPart:
    part = ctx.projection.state.policy_memory
    assert isinstance(part, SelsmMemoryPart), "a selsm run folds into policies.selsm.memory.SelsmMemory"
    return part


def skill_lookup(ctx, cfg: SelsmPolicy, view: CaseView, stage1: dict | None = None) -> StepMemory:
    """Per-step retrieval for one case: state -> the top M skills. Stage 1 depends only on the
    query and the records, so it is computed once per (case, number of records) and kept in
    `stage1`; the memory does not change while a case acts or samples."""
    proj = ctx.projection
    part = part_of(ctx)
    # The query portion q* of every state agent_state builds for this case; query and states are read
    # de-identified, as the records they are compared with were stored.
    query = ctx.retrieval_text(view.question.strip(), view.case_id)
    stage1 = {} if stage1 is None else stage1
    own = proj.own_cases(view.case_id)  # leakage guard: the case and its content twins

    def lookup(state: str) -> list[MemoryItem]:
        if not part.records or cfg.top_m_skills == 0:
            return []
        # Within the embedder's window, as memory.py embeds the stored states (state_view.py).
        state_vec = proj.embed(embedded_state(ctx.retrieval_text(state, view.case_id), cfg.state_view))
        if cfg.two_stage:
            key = (view.case_id, len(part.records))
            if stage1.get("key") != key:
                stage1.update(key=key, candidates=candidate_records(part, proj.embed(query), cfg.top_q_records,
                                                                    own))
            hits = two_stage(part, proj.embed(query), state_vec, own, cfg.top_q_records,
                             cfg.state_threshold, cfg.top_m_skills, stage1["candidates"])
        else:
            hits = state_only(part, state_vec, own, cfg.state_threshold, cfg.top_m_skills,
                              cfg.transition_pool)
        return [_item(h) for h in hits]

    return lookup


async def collect_training_trajectories(ctx, case: Case, memory: MemoryRetrieved, samples: int,
                                        step_memory: StepMemory | None) -> list[tuple[int, AnswerGiven]]:
    """The paper's training-phase collection: `samples` further runs of the act stage on the case
    (sample 1, 2, ...), each with its own seeded generator and its own seeded tool outputs, so
    the sim differs through lexical tie-breaks and tool draws. Model backbones record each
    sample's exchanges under the reflect stage. A sample whose act fails is skipped.

    The act view has no gold answer, as in the act stage. Model backbones sample at the
    gateway's configured temperature: the backbone interface has no per-call temperature, so
    a temperature-0 model gives K near-identical trajectories (see the README section).
    """
    view = case.view()
    out: list[tuple[int, AnswerGiven]] = []
    for k in range(1, samples + 1):
        rng = case_rng(ctx.seed, case.case_id, f"selsm-sample:{k}")
        tool_seed = int(case_rng(ctx.seed, case.case_id, f"selsm-sample-tools:{k}").integers(2 ** 31))
        extra = ({"recorder": stage_recorder(ctx.writer, case.case_id, "reflect")}
                 if records_exchanges(ctx.backbone) else {})
        if step_memory is not None:
            extra["step_memory"] = step_memory
        if case.kind == "fhir":  # a re-run through fresh FHIR tools (a real server is only read)
            env = ctx.environment
            tools = env.tools_for(case)
            try:
                answer = await ctx.backbone.act_fhir(view, memory, tools, **extra)
            except CaseFailure:
                continue
            out.append((k, answer.model_copy(update={"steps": env.recorded_steps(answer.steps, tools)})))
            continue
        try:
            answer = await ctx.backbone.act(view, memory, ToolBox(case, ctx.tools, tool_seed), rng, **extra)
        except CaseFailure:
            continue
        if answer.answer in view.options:
            out.append((k, answer))
    return out


class SelsmMemory(MemoryPolicy):
    config: SelsmPolicy

    def __init__(self, config: SelsmPolicy):
        super().__init__(config)
        self._stage1: dict = {}  # stage 1 of the current case, shared by its act and its samples

    def retrieve(self, ctx, case, memory_seq):
        return MemoryRetrieved(memory_seq=memory_seq, prefix=render_items([]) + "\n" + STEP_NOTE)

    def step_memory(self, ctx, view, memory):
        return skill_lookup(ctx, self.config, view, self._stage1) if self.config.top_m_skills else None

    async def reflect(self, ctx, case: Case, memory: MemoryRetrieved, answer: AnswerGiven,
                      fb: FeedbackRecorded) -> CaseFailed | None:
        if not self.writes:
            return None
        cfg = self.config
        trajectories = [(0, answer)]
        if cfg.train_samples > 1:
            trajectories += await collect_training_trajectories(
                ctx, case, memory, cfg.train_samples - 1, self.step_memory(ctx, case.view(), memory))
        fhir = case.kind == "fhir"
        allowed = "" if fhir else "\n".join(case.options.values())
        kept: list[StoredTransition] = []
        seen: set = set()
        cause = None
        record_id = f"rec-{len(part_of(ctx).records):05d}"
        for sample, ans in trajectories:
            decisions = decisions_of(case.question, ans.steps)
            gold = ""
            if fhir:  # graded by the environment: the act stage's verdict, or the sample's own
                correct, gold = (fb.correct, fb.gold) if sample == 0 else await ctx.environment.grade(case, ans)
            else:
                correct = ans.answer == case.answer
            verdict = await ask_or_fail(ctx, case.case_id, "reflect",
                                        judge_task(case, decisions, ans, correct, cfg.reasoning_trace, gold))
            if isinstance(verdict, CaseFailed):
                return verdict  # nothing is stored from a case whose judging failed
            steps = judged_steps(verdict, decisions, case, cfg.operational_logic)
            labels = [StepLabelled(round=s.round, action=s.action, label=s.skill.label) for s in steps]
            cause = ctx.writer.emit(TrajectoryJudged(sample=sample, answer=ans.answer, correct=correct,
                                                     reasoning_shown=cfg.reasoning_trace, steps=labels),
                                    case_id=case.case_id)
            instance = "\n".join([case.question, *(d.observation for d in decisions)])
            by_round = {d.round: d for d in decisions}
            for step in steps:
                violations = check_skill(step.skill, instance_text=instance, allowed_text=allowed)
                if violations:
                    ctx.writer.emit(SkillRejected(sample=sample, round=step.round, label=step.skill.label,
                                                  violations=violations, text=render_skill(step.skill)),
                                    case_id=case.case_id, causation_seq=cause)
                    continue
                state = by_round[step.round].state
                key = (state, step.action, step.skill.model_dump_json())
                if key in seen:  # T_i is a set: a repeated tuple adds nothing
                    continue
                seen.add(key)
                kept.append(StoredTransition(skill_id=f"{record_id}.{sample}.{step.round}", sample=sample,
                                             round=step.round, state=state, action=step.action, skill=step.skill))
        if kept:
            ctx.writer.emit(RecordStored(record_id=record_id, source_case_id=case.case_id,
                                         query=case.question.strip(), transitions=kept),
                            case_id=case.case_id, causation_seq=cause)
        return None
