"""SkeMex's stage-facing mechanism (seed 001): Read–Write–Assess–Govern.

retrieve: value-aware retrieval (retrieval.py). reflect: the case's trajectory enters the
learning window (buffer.py); when the window is full, retained trajectories are distilled
in two passes and reviewed (distill.py), then every skill adopted in the window gets its
utility update (utility.py) and the window closes. govern: after every
`governance_every` windows, merge / deprecate / mature / capacity (governance.py). All
of it happens through `skill.*` events (handlers/policies/skemex/events.py).
"""

from __future__ import annotations

from grandrounds.handlers.llm.errors import CaseFailure
from grandrounds.handlers.cases import Case
from grandrounds.handlers.policies.base import MemoryPolicy, ask
from grandrounds.handlers.policies.render import render_items
from grandrounds.handlers.policies.skemex import buffer, distill, governance, retrieval, utility
from grandrounds.handlers.policies.skemex.config import SkeMexPolicy
from grandrounds.handlers.policies.skemex import events as sk
from grandrounds.store.event_types import AnswerGiven, FeedbackRecorded, MemoryItem, MemoryRetrieved
from grandrounds.handlers.policies.skemex.memory import Skill, SkillMemory, bucket_of

r6 = utility.r6
SECTION = {"general": "Skills — general", "task": "Skills — task-level", "action": "Skills — action-level"}
GUIDANCE = ("Skills are prioritised experience with explicit applicability conditions: check the conditions "
            "before following one, and cite the skill id (e.g. [t000001]) in your reasoning when it shapes a step.")


def skill_memory(ctx) -> SkillMemory:
    mem = ctx.projection.state.policy_memory
    assert isinstance(mem, SkillMemory), "the run's projection has no SkeMex memory part"
    return mem


def case_tools(ctx, case: Case) -> list[str]:
    """The tools this case's agent can call (as ToolBox decides; a FHIR task: the environment's functions)."""
    if case.kind == "fhir":
        return sorted(f.name for f in ctx.environment.functions)
    wanted = case.tools or sorted(ctx.tools)
    return [t for t in wanted if t in ctx.tools]


def item_text(s: Skill) -> str:
    b = s.body
    tools = f" Requires: {', '.join(b.required_tools)}." if b.required_tools else ""
    return f"[{s.skill_id}] {b.name} — When: {b.description} Applies if: {b.applicable_conditions}{tools} Do: {b.core_action}"


class SkeMexMemory(MemoryPolicy):
    config: SkeMexPolicy

    # --- Read -------------------------------------------------------------------------------

    def retrieve(self, ctx, case: Case, memory_seq: int) -> MemoryRetrieved:
        cfg, mem = self.config, skill_memory(ctx)
        chosen: list[retrieval.Scored] = []
        if cfg.top_k and mem.indexes:
            query = ctx.projection.embed(ctx.retrieval_text(case.question, case.case_id))
            pool = retrieval.candidates(mem, cfg, ctx.projection.own_cases(case.case_id), case.category,
                                      case_tools(ctx, case), query)
            chosen = retrieval.select(pool, cfg)
        items = [MemoryItem(kind="skill", item_id=c.skill.skill_id, text=item_text(c.skill),
                            trigger=list(c.skill.body.trigger), relevance=r6(c.similarity), score=r6(c.score),
                            detail={"branch": c.skill.branch, "status": c.skill.status,
                                    "utility": r6(c.skill.utility), "strength": r6(c.strength),
                                    "bucket": c.skill.bucket, "window": mem.window})
                 for c in chosen]
        sections = [(SECTION[b], [i for i in items if i.detail["branch"] == b]) for b in retrieval.BRANCHES]
        prefix = render_items(sections)
        if items:
            prefix += "\n" + GUIDANCE
        return MemoryRetrieved(memory_seq=memory_seq, prefix=prefix, items=items)

    # --- Write + Assess -----------------------------------------------------------------------

    async def reflect(self, ctx, case: Case, memory: MemoryRetrieved, answer: AnswerGiven,
                      fb: FeedbackRecorded) -> None:
        cfg, mem = self.config, skill_memory(ctx)
        if not self.writes or case.case_id in mem.recorded_cases:  # frozen, or a resumed case already recorded
            return None
        reward = 1.0 if fb.correct else 0.0
        injected = [i.item_id for i in memory.items if i.kind == "skill"]
        reason = buffer.drop_reason(answer, reward, cfg) if cfg.buffer_gating else None
        ctx.writer.emit(sk.TrajectoryRecorded(
            case_id=case.case_id, category=case.category, reward=reward, turns=buffer.turns(answer.steps),
            injected=injected, adoption=buffer.heuristic_labels(answer, injected, reward),
            retained=reason is None, drop_reason=reason, question=case.question,
            # A FHIR task has no options; its reference is the official grader's verdict (`refsol:taskN: reason`).
            options={} if case.kind == "fhir" else case.options,
            gold=fb.gold if case.kind == "fhir" else case.answer, answer=answer.answer, answer_source=answer.source,
            trace=[f"{s.kind}: {s.content}" for s in answer.steps], tools=case_tools(ctx, case)),
            case_id=case.case_id)
        if len(mem.buffer) >= cfg.window:
            await self._close_window(ctx, case)
        return None

    async def _close_window(self, ctx, case: Case) -> None:
        cfg, mem = self.config, skill_memory(ctx)
        emit, cid = ctx.writer.emit, case.case_id
        window, trajectories = mem.window, list(mem.buffer)
        distil, over = buffer.to_distil(trajectories, cfg)
        failed: list[str] = []
        for t in distil:
            try:
                await self._distil(ctx, case, t)
            except CaseFailure:
                failed.append(t.case_id)  # the gateway recorded the failed call; nothing is written
        labels = {c: a.labels for c, a in mem.assessments.items()}
        credits, baselines = utility.window_credits(trajectories, labels, mem.baselines, cfg)
        for skill_id in sorted(credits):
            s = mem.skills.get(skill_id)
            if s is None:
                continue
            c = credits[skill_id]
            new, lr, mean = (utility.updated_utility(s.utility, s.usage, c, cfg) if cfg.valuation
                             else (s.utility, 0.0, r6(sum(c.deltas) / len(c.deltas))))
            emit(sk.SkillUtilityUpdated(skill_id=skill_id, window=window, old=s.utility, new=new, lr=lr,
                                        mean_delta=mean, adopted_pos=c.pos, adopted_neg=c.neg,
                                        advantages=c.advantages), case_id=cid)
        emit(sk.WindowClosed(window=window, cases=[t.case_id for t in trajectories],
                             distilled=[t.case_id for t in distil if t.case_id not in failed], over_capacity=over,
                             failed=failed, baselines={k: (b.ema, b.n) for k, b in sorted(baselines.items())}),
             case_id=cid)

    async def _distil(self, ctx, case: Case, t: sk.TrajectoryRecorded) -> None:
        """Pass 1 (labels + decision), then pass 2 (the draft or patch) and review."""
        cfg, mem = self.config, skill_memory(ctx)
        emit, cid = ctx.writer.emit, case.case_id
        injected = [mem.skills[i] for i in t.injected if i in mem.skills]
        a = await ask(ctx, cid, "reflect", distill.assess_task(t, injected))
        known = {s.skill_id for s in injected}
        labels = {j.skill_id: j.label for j in a.labels if j.skill_id in known}
        labels = {i: labels.get(i, "ignored") for i in sorted(known)}
        target = mem.skills.get(a.target_skill_id) if a.decision == "PATCH" and a.target_skill_id in known else None
        decision = "NONE" if a.decision == "PATCH" and (target is None or not target.live) else a.decision
        emit(sk.TrajectoryAssessed(case_id=t.case_id, labels=labels, decision=decision,
                                   target_skill_id=target.skill_id if decision == "PATCH" else None,
                                   rationale=a.rationale), case_id=cid)
        if decision == "NONE":
            return
        draft = await ask(ctx, cid, "reflect", distill.draft_task(t, a, target if decision == "PATCH" else None))
        body = distill.body_of(draft)
        if decision == "PATCH":
            self._review_patch(ctx, cid, t, target, body)
        else:
            self._review_create(ctx, cid, t, a, body)

    def _review_patch(self, ctx, cid: str, t: sk.TrajectoryRecorded, target: Skill, body: sk.SkillBody) -> None:
        problem = distill.quality_problem(body, target.branch, target.tool, self.config) if self.config.review else None
        ctx.writer.emit(sk.SkillReviewed(skill_id=target.skill_id, kind="patch", accepted=problem is None,
                                         reason=problem or "patch passes quality", source_case_id=t.case_id),
                        case_id=cid)
        if problem is None:
            ctx.writer.emit(sk.SkillPatched(skill_id=target.skill_id, body=body, version=target.version + 1,
                                            source_case_id=t.case_id, reason="distilled patch"), case_id=cid)

    def _review_create(self, ctx, cid: str, t: sk.TrajectoryRecorded, a: distill.Assessment,
                       body: sk.SkillBody) -> None:
        cfg, mem = self.config, skill_memory(ctx)
        branch = a.branch or "task"
        tool = (a.tool or (body.required_tools[0] if body.required_tools else None)) if branch == "action" else None
        if branch == "action" and tool and tool not in body.required_tools:
            body = body.model_copy(update={"required_tools": sorted({*body.required_tools, tool})})
        category = t.category if branch == "task" else None
        skill_id = mem.next_id(branch)
        ctx.writer.emit(sk.SkillDrafted(skill_id=skill_id, branch=branch, category=category, tool=tool, body=body,
                                        utility=cfg.initial_utility, source_case_id=t.case_id), case_id=cid)
        problem = self._review_problem(ctx, mem.skills[skill_id]) if cfg.review else None
        ctx.writer.emit(sk.SkillReviewed(skill_id=skill_id, kind="create", accepted=problem is None,
                                         reason=problem or "novel, well-formed, within capacity",
                                         source_case_id=t.case_id), case_id=cid)

    def _review_problem(self, ctx, draft: Skill) -> str | None:
        cfg, mem = self.config, skill_memory(ctx)
        problem = distill.quality_problem(draft.body, draft.branch, draft.tool, cfg)
        if problem:
            return problem
        near = mem.search(draft.bucket, draft.vec, 1)
        if near and near[0][1] >= cfg.novelty_cosine:
            return f"novelty: near-duplicate of {near[0][0].skill_id} (cosine {near[0][1]:.3f})"
        if cfg.capacity:
            held = [s for s in mem.in_bucket(bucket_of(draft.branch, draft.category, draft.tool))
                    if s.status == "mature"]
            if len(held) >= governance.capacity_of(draft.bucket, cfg):
                return "capacity: the branch is full of mature skills"
        return None

    # --- Govern -----------------------------------------------------------------------------

    async def govern(self, ctx, case: Case, index: int, fb: FeedbackRecorded) -> None:
        cfg, mem = self.config, skill_memory(ctx)
        if not (self.writes and cfg.governance):
            return
        last_closed = mem.window - 1
        if last_closed < 0 or mem.window % cfg.governance_every or mem.governed_window == last_closed:
            return
        emit, cid = ctx.writer.emit, case.case_id
        p = governance.plan(mem, cfg)
        for kept, gone, cos in p.merged:
            emit(sk.SkillMerged(kept=kept.skill_id, absorbed=gone.skill_id, cosine=r6(cos), window=last_closed),
                 case_id=cid)
        for s in p.deprecated:
            emit(sk.SkillDeprecated(skill_id=s.skill_id, utility=s.utility, window=last_closed,
                                    reason=f"utility {s.utility:.3f} < {cfg.deprecate_below}"), case_id=cid)
        for s in p.matured:
            emit(sk.SkillMatured(skill_id=s.skill_id, utility=s.utility, usage=s.usage, window=last_closed),
                 case_id=cid)
        for s in p.archived:
            emit(sk.SkillArchived(skill_id=s.skill_id, reason=f"capacity of {s.bucket}", window=last_closed),
                 case_id=cid)
        emit(sk.GovernancePassed(window=last_closed, merged=len(p.merged), deprecated=len(p.deprecated),
                                 matured=len(p.matured), archived=len(p.archived)), case_id=cid)
