"""The offline `sim` backbone: deterministic, model-free, for tests, demos and throughput.

Its numbers are never clinical accuracy. While acting it does not see the gold answer: it
follows an injected memory item whose trigger overlaps the case and which names one of the
options, uses tools as their governance labels allow, and otherwise picks the option with
the highest lexical overlap. While reflecting (gold legitimately visible) it writes a rule
and guideline linking the case's key terms to the correct option text. Learning curves
therefore depend only on retrieval, valuation and governance — what the tests probe.

FHIR tasks (MedAgentBench): the sim acts with the scripted template agent
(`handlers.agent.fhir_react.sim_fhir_agent`) through the environment's FHIR tools, and reflects
by linking the task template's key terms to the action pattern the official grader checks.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import numpy as np

from grandrounds.handlers.cases import Case, CaseView, FhirCase, FhirCaseView
from grandrounds.handlers.policies.base import agent_state
# the sim reflector's rule wording lives with the policies that also write it (skemex); re-exported
from grandrounds.handlers.policies.precedents import rule_text  # noqa: F401
from grandrounds.handlers.text import content_tokens, key_terms, trigger_overlap
from grandrounds.handlers.tools import ToolBox
from grandrounds.store.event_types import (AgentStep, AnswerGiven, FeedbackRecorded, MemoryRetrieved,
                               ReflectionRecorded, RuleEditProposal, ToolCall)

SIM_NOTE = "sim backbone: offline simulator for tests and demos; its accuracy is not a clinical measure"


def option_named(text: str, options: dict[str, str]) -> str | None:
    """The option whose full text appears in `text` (the longest, if several)."""
    low = text.lower()
    hits = [(len(t), k) for k, t in options.items() if t.lower() in low]
    return max(hits)[1] if hits else None


def lexical_choice(view: CaseView, rng: np.random.Generator) -> tuple[str, int]:
    q = content_tokens(view.question)
    scored = [(len(content_tokens(text) & q), letter) for letter, text in view.options.items()]
    best = max(s for s, _ in scored)
    tied = sorted(letter for s, letter in scored if s == best)
    return tied[int(rng.integers(len(tied)))], best


def build_sim_backbone(name: str = "sim", model: str | None = None, **_ignored) -> "SimBackbone":
    """The registered factory (handlers/backbones/registry.py): the sim takes no options."""
    return SimBackbone()


class SimBackbone:
    name = "sim"
    model = None
    note = SIM_NOTE

    def __init__(self, follow_overlap: float = 0.25, edit_overlap: float = 0.6):
        self.follow_overlap = follow_overlap
        self.edit_overlap = edit_overlap

    async def solve(self, task):
        """A policy's model task (distillation, judging, lessons): the task's offline answer."""
        return task.offline()

    async def act(self, view: CaseView, memory: MemoryRetrieved, toolbox: ToolBox,
                  rng: np.random.Generator, step_memory=None) -> AnswerGiven:
        q = content_tokens(view.question)
        steps: list[AgentStep] = []

        # Per-step retrieval (SELSM) happens before the decision; the trajectory records what was shown.
        step_items = list(step_memory(agent_state(view.question, []))) if step_memory is not None else []
        if step_memory is not None:
            steps.append(AgentStep(kind="memory", content=",".join(i.item_id for i in step_items)))

        # Distilled knowledge (rules, or another policy's skills and lessons) takes precedence over
        # raw episodes; within a tier, the best-matching item, the earlier on ties.
        distilled = [(f"rule:{r.rule_id}", r.text, r.trigger) for r in memory.rules]
        distilled += [(f"{i.kind}:{i.item_id}", i.text, i.trigger) for i in (*memory.items, *step_items)]
        raw = [(f"episode:{e.episode_id}", e.guideline, e.trigger) for e in memory.episodes]
        follow: tuple[str, str, float] | None = None  # (source, letter, overlap)
        for tier in (distilled, raw):
            for source, text, trigger in tier:
                letter = option_named(text, view.options)
                overlap = trigger_overlap(trigger, q)
                if letter and overlap >= self.follow_overlap and (follow is None or overlap > follow[2]):
                    follow = (source, letter, overlap)
            if follow:
                break
        if follow:
            steps.append(AgentStep(kind="reasoning",
                                   content=f"{follow[0]} matches {follow[2]:.2f} of its trigger and names {follow[1]}"))

        labels = {g.tool: g.label for g in memory.tool_guidance}
        outputs: list[tuple[str, str, str | None]] = []  # (tool, label, output)
        for name in toolbox.names:
            label = labels.get(name, "Caution")
            if label == "Avoid":
                steps.append(AgentStep(kind="reasoning", content=f"skip {name}: governance says Avoid"))
                continue
            out = toolbox.call(name)
            steps.append(AgentStep(kind="tool", content=name))
            steps.append(AgentStep(kind="observation", content=f"{name} -> {out if out else 'no result'}"))
            outputs.append((name, label, out))

        def first(label: str) -> tuple[str, str] | None:
            return next(((t, o) for t, l, o in outputs if l == label and o), None)

        trusted, caution = first("Trusted"), first("Caution")
        if follow and not follow[0].startswith("episode:"):
            answer, source = follow[1], follow[0]
        elif trusted:
            answer, source = trusted[1], f"tool:{trusted[0]}"
        elif follow:
            answer, source = follow[1], follow[0]
        elif caution:
            answer, source = caution[1], f"tool:{caution[0]}"
        else:
            answer, overlap = lexical_choice(view, rng)
            source = "lexical"
            steps.append(AgentStep(kind="reasoning", content=f"no applicable memory or tool; lexical overlap {overlap}"))
        steps.append(AgentStep(kind="response", content=answer))
        calls = [ToolCall(tool=t, label=l, output=o, adopted=o is not None and o == answer) for t, l, o in outputs]
        return AnswerGiven(answer=answer, source=source, steps=steps, tool_calls=calls)

    async def act_fhir(self, view: FhirCaseView, memory: MemoryRetrieved, tools, step_memory=None) -> AnswerGiven:
        """A FHIR task through the environment's tools (`FhirTools`): the scripted template agent
        (per-step retrieval, SELSM's, is called and recorded; the script does not follow it)."""
        from grandrounds.handlers.agent.fhir_react import sim_fhir_agent

        return await sim_fhir_agent(view, tools, step_memory)

    async def act_osce(self, view, memory: MemoryRetrieved, tools, step_memory=None) -> AnswerGiven:
        """An AgentClinic OSCE case through the environment's patient and measurement tool (`OsceTools`):
        the sim doctor, following a memory rule whose trigger matches what it heard."""
        from grandrounds.handlers.agent.osce_act import run_osce_act

        return await run_osce_act(view, memory, tools)

    async def reflect(self, case: Case, memory: MemoryRetrieved, answer: AnswerGiven,
                      feedback: FeedbackRecorded) -> ReflectionRecorded:
        if isinstance(case, FhirCase):
            return fhir_reflection(case, memory, answer, feedback)
        if getattr(case, "kind", None) == "osce":
            return osce_reflection(case, memory, answer, feedback)
        gold_text = case.options[case.answer]
        terms = key_terms(case.question)
        summary = (f"[{case.category}] Answered {answer.answer} ('{case.options[answer.answer]}') via "
                   f"{answer.source}; correct was {case.answer} ('{gold_text}').")
        guideline = f"When a case presents with {', '.join(terms[:6])}, the answer is '{gold_text}'."
        new_text = rule_text(terms, gold_text)
        edits: list[RuleEditProposal] = []
        followed = followed_rule(memory, answer)
        if followed is not None and not feedback.correct:
            overlap = trigger_overlap(followed.trigger, content_tokens(case.question))
            if overlap >= self.edit_overlap:
                edits.append(RuleEditProposal(op="edit", rule_id=followed.rule_id, text=new_text, trigger=terms,
                                              reason="rule matched this presentation but named the wrong option"))
            else:
                if followed.priority == 2:
                    edits.append(RuleEditProposal(op="retire", rule_id=followed.rule_id,
                                                  reason="misled on a case it only partly matched, already lowest priority"))
                else:
                    edits.append(RuleEditProposal(op="reprioritise", rule_id=followed.rule_id,
                                                  priority=min(2, followed.priority + 1),  # demoted
                                                  reason="misled on a case it only partly matched"))
                edits.append(RuleEditProposal(op="add", text=new_text, trigger=terms, priority=0,
                                              reason="corrective rule after a wrong answer"))
        elif followed is None:
            edits.append(RuleEditProposal(op="add", text=new_text, trigger=terms,
                                          priority=1 if feedback.correct else 0,
                                          reason="consolidate a correct answer" if feedback.correct
                                          else "corrective rule after a wrong answer"))
        return ReflectionRecorded(summary=summary, guideline=guideline, edits=edits)


def fhir_action_summary(answer: AnswerGiven) -> str:
    """`GET Patient, POST Observation` from the recorded tool steps (the environment's call records)."""
    calls = []
    for step in answer.steps:
        if step.kind == "tool":
            c = json.loads(step.content)
            calls.append(f"{c['method']} {urlsplit(c['url']).path.rsplit('/', 1)[-1]}")
    return ", ".join(calls) or "no FHIR call"


def fhir_reflection(case: FhirCase, memory: MemoryRetrieved, answer: AnswerGiven,
                    feedback: FeedbackRecorded) -> ReflectionRecorded:
    """After grading: a rule linking the task template's key terms to the action pattern the official
    grader checks (`REFERENCE_PATTERNS`, the gold side, visible now). A rule that was followed and
    misled is rewritten; otherwise the rule is proposed (evo turns a near-duplicate into an escalation)."""
    from grandrounds.handlers.environments.medagentbench import REFERENCE_PATTERNS, template_terms

    terms = template_terms(case.instruction)
    verdict = "correct" if feedback.correct else "wrong"
    summary = (f"[{case.category}] {fhir_action_summary(answer)}, then FINISH({answer.answer}) via "
               f"{answer.source}: {verdict} ({feedback.gold}).")
    guideline = f"For tasks like '{' '.join(terms)}': {REFERENCE_PATTERNS[case.task_type]}."
    edits = rewrite_or_propose(followed_rule(memory, answer), feedback.correct, guideline, terms,
                               misled="rule was followed on this task template and the grader refused it",
                               consolidate="consolidate a graded-correct action pattern",
                               corrective="corrective rule after a wrong action")
    return ReflectionRecorded(summary=summary, guideline=guideline, edits=edits)


def osce_reflection(case, memory: MemoryRetrieved, answer: AnswerGiven, fb: FeedbackRecorded) -> ReflectionRecorded:
    """An AgentClinic OSCE case (`OsceCase`): a rule linking the case's key findings to the correct diagnosis.
    A followed rule that misled is rewritten; otherwise the rule is proposed (evo turns a
    near-duplicate into an escalation)."""
    from grandrounds.handlers.environments.osce_env import dialogue_summary, osce_terms

    terms = osce_terms(case, answer)
    verdict = "correct" if fb.correct else "wrong"
    summary = (f"[{case.category}] {dialogue_summary(answer)}; diagnosed '{answer.answer}' via {answer.source}: "
               f"{verdict} (correct: '{case.correct_diagnosis}').")
    guideline = f"When the presentation includes {', '.join(terms)}, consider '{case.correct_diagnosis}'."
    edits = rewrite_or_propose(followed_rule(memory, answer), fb.correct, rule_text(terms, case.correct_diagnosis),
                               terms, misled="rule was followed on this presentation and the diagnosis was wrong",
                               consolidate="consolidate a correct diagnosis",
                               corrective="corrective rule after a wrong diagnosis")
    return ReflectionRecorded(summary=summary, guideline=guideline, edits=edits)


def followed_rule(memory: MemoryRetrieved, answer: AnswerGiven):
    """The retrieved rule the answer followed (its `source` names it), or None."""
    return next((r for r in memory.rules if f"rule:{r.rule_id}" == answer.source), None)


def rewrite_or_propose(followed, correct: bool, text: str, terms: list[str], *, misled: str, consolidate: str,
                       corrective: str) -> list[RuleEditProposal]:
    """The FHIR and OSCE reflections' edits: a followed rule that misled is rewritten to `text`; with no
    rule followed, `text` is proposed (priority 1 after a correct answer, 0 after a wrong one); a
    followed rule that was right needs no edit."""
    if followed is not None and not correct:
        return [RuleEditProposal(op="edit", rule_id=followed.rule_id, text=text, trigger=terms, reason=misled)]
    if followed is None:
        return [RuleEditProposal(op="add", text=text, trigger=terms, priority=1 if correct else 0,
                                 reason=consolidate if correct else corrective)]
    return []
