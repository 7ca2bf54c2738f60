"""Distilling a case into RetroSum lessons: the prompt, the response model, the offline writer.

After feedback (gold visible) one structured model call reads the case, the agent's whole
trajectory (its retrospective summaries included), the lessons it was shown and the outcome,
and writes two lists, as the paper's experience generation does: actor lessons (how to
reason towards the answer) and summariser lessons (what the summary must preserve or link).
The published code asks two prompts (reasoning, summary); one call with both lists gives
the same content with one recorded exchange per case.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from grandrounds.handlers.agent.protocol import stated_answer
from grandrounds.handlers.cases import Case, FhirCase
from grandrounds.handlers.policies.base import ModelTask
from grandrounds.handlers.policies.fhir_lessons import fhir_terms, procedure, task_label, verdict_line
from grandrounds.handlers.text import key_terms
from grandrounds.store.event_types import AnswerGiven, FeedbackRecorded, MemoryItem

PURPOSE = "experience-lessons"


def patient_context(question: str) -> str:
    """The text an experience is keyed by, and the query a case retrieves with.

    The paper embeds the patient's recent clinical context (the published code: the latest
    records of every EHR table). An MCQ case has no record beyond its vignette, so the patient
    context is the question text, stripped: everything known about the patient before acting.
    The options are left out (they are the answer space, not the patient) and so is the
    category (a label, not a finding). It is gold-free, so retrieval may use it."""
    return question.strip()


class LessonDraft(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str = Field(description="The lesson: one or two sentences, general and reusable.")
    trigger: list[str] = Field(default_factory=list,
                               description="Key clinical terms of presentations the lesson applies to.")


class ExperienceDraft(BaseModel):
    """The lesson writer's answer."""

    model_config = ConfigDict(extra="ignore")

    actor_lessons: list[LessonDraft] = Field(
        default_factory=list,
        description="Reasoning lessons for the agent that answers: which findings decide between the options, "
                    "which answer a presentation like this calls for, what misled it.")
    summariser_lessons: list[LessonDraft] = Field(
        default_factory=list,
        description="Lessons for the retrospective summariser: which findings, values and links a summary of "
                    "a case like this must keep so the right answer stays reachable.")


SYSTEM = """You are the hindsight auditor of a clinical reasoning agent's experience bank.
After each case you see the case, the agent's whole trajectory (with the retrospective summaries its
summariser wrote), the lessons it was shown, what it answered and the correct answer. Knowing the
outcome, find what decided it, and write two kinds of reusable lessons:
- actor_lessons (at most {max_actor}): how to reason on a presentation like this one. When the agent was
  wrong, say which findings point to the correct answer and what misled it. A lesson may name the correct
  option by its full text (never by its letter: letters change between cases). Give each lesson a
  trigger: 4-10 key clinical terms of presentations it applies to.
- summariser_lessons (at most {max_summariser}): what a summary of such a case must preserve or link
  (exact abnormal values, the finding that separates close alternatives, timing). No answers here.
Lessons must be general clinical reasoning: no patient identifiers, ages, dates or case numbers, and
nothing that only restates the instructions. Write no lesson rather than a vague one."""


FHIR_SYSTEM = """You are the hindsight auditor of an EHR agent's experience bank. The agent does MedAgentBench
tasks through FHIR functions (GET reads, POST writes) and answers with FINISH([...]); the official grader
checks its calls and its FINISH list. After each task you see the instruction and its context, the agent's
whole trajectory, the lessons it was shown, what it finished with and the grader's verdict. Knowing the
outcome, find what decided it, and write reusable lessons:
- actor_lessons (at most {max_actor}): how to do a task of this template: which FHIR calls (resource type,
  search parameters, payload fields) and which FINISH list it needs; when the agent was wrong, what the
  grader refused and what to do instead. Give each lesson a trigger: 4-10 key terms of the task template.
- summariser_lessons (at most {max_summariser}): what a summary of such a trajectory must keep (the values
  a response returned that the answer needs). Leave it empty when nothing applies.
Lessons must transfer to other patients: no patient names, identifiers, dates, hosts or values of this task,
and nothing that only restates the instructions. Write no lesson rather than a vague one."""


def fhir_lesson_prompt(case: FhirCase, answer: AnswerGiven, fb: FeedbackRecorded, shown: list[MemoryItem]) -> str:
    trace = "\n".join(f"{s.kind}: {s.content[:1500]}" for s in answer.steps) or "(no steps recorded)"
    taught = "\n".join(f"- ({i.detail.get('audience', 'actor')}) {i.text}" for i in shown) or "(none)"
    verdict = "correct" if fb.correct else "wrong"
    summaries = [s.content for s in answer.steps if s.kind == "summary"]  # (none in runs before issue 44)
    summary = f"## Latest retrospective summary\n{summaries[-1]}\n\n" if summaries else ""
    return (f"## FHIR task (type {case.task_type}, category: {case.category})\n{case.instruction}\n\n"
            f"## Context\n{case.context}\n\n## Lessons the agent was shown\n{taught}\n\n"
            f"## Agent trajectory\n{trace}\n\n{summary}## Outcome\nAgent finished with {answer.answer} (via "
            f"{answer.source}); graded {verdict} by {fb.gold}.")


def offline_fhir_lessons(case: FhirCase, answer: AnswerGiven, fb: FeedbackRecorded) -> ExperienceDraft:
    """The `sim` lesson writer on a FHIR task: the template's key terms and the trajectory's action
    pattern (resource types, parameter and field names, FINISH shape), kept on success and flagged on
    failure. No summariser lesson: the sim agent writes no retrospective summary."""
    terms = fhir_terms(case.instruction)
    label, pattern = task_label(terms), procedure(answer.steps, answer.answer)
    text = (f"For {label}: {pattern}; {verdict_line(True)}." if fb.correct else
            f"For {label}: {pattern} — {verdict_line(False)}.")
    return ExperienceDraft(actor_lessons=[LessonDraft(text=text, trigger=terms)], summariser_lessons=[])


def lesson_prompt(case: Case, answer: AnswerGiven, fb: FeedbackRecorded, shown: list[MemoryItem]) -> str:
    if case.kind == "fhir":
        return fhir_lesson_prompt(case, answer, fb, shown)
    options = "\n".join(f"{k}) {v}" for k, v in case.options.items())
    trace = "\n".join(f"{s.kind}: {s.content}" for s in answer.steps) or "(no steps recorded)"
    summaries = [s.content for s in answer.steps if s.kind == "summary"]
    summary = summaries[-1] if summaries else "(no retrospective summary was written)"
    taught = "\n".join(f"- ({i.detail.get('audience', 'actor')}) {i.text}" for i in shown) or "(none)"
    verdict = "correct" if fb.correct else "wrong"
    return (f"## Case (category: {case.category})\n{case.question}\n\nOptions:\n{options}\n\n"
            f"## Lessons the agent and its summariser were shown\n{taught}\n\n"
            f"## Agent trajectory\n{trace}\n\n## Latest retrospective summary\n{summary}\n\n"
            f"## Outcome\nAgent answered {stated_answer(answer.answer, case.options)} (via {answer.source}); "
            f"correct answer: {case.answer}) {case.options[case.answer]} ({verdict}).")


def offline_lessons(case: Case, answer: AnswerGiven, fb: FeedbackRecorded) -> ExperienceDraft:
    """The `sim` backbone's lesson writer, from the inputs the prompt shows (gold included:
    this runs after feedback). The actor lesson names the correct option's text, never its
    letter, with the case's key terms as trigger, so a later case of the same presentation
    can follow it. No lesson names a wrong option's text: the sim follows any option a
    lesson names."""
    if case.kind == "fhir":
        return offline_fhir_lessons(case, answer, fb)
    terms = key_terms(case.question)
    gold_text = case.options[case.answer]
    actor = [LessonDraft(text=f"When the presentation includes {', '.join(terms[:8])}: favour '{gold_text}'.",
                         trigger=terms)]
    if not fb.correct:
        actor.append(LessonDraft(
            text=f"On such a presentation the answer via {answer.source} was wrong: weigh the distinguishing "
                 f"findings ({', '.join(terms[:4])}) against every option before committing.",
            trigger=terms))
    summariser = [LessonDraft(text=f"Keep these findings verbatim in the summary and link them to each other: "
                                   f"{', '.join(terms[:6])}; they decided a similar presentation.")]
    return ExperienceDraft(actor_lessons=actor, summariser_lessons=summariser)


def lesson_task(case: Case, answer: AnswerGiven, fb: FeedbackRecorded, shown: list[MemoryItem],
                max_actor: int, max_summariser: int) -> ModelTask[ExperienceDraft]:
    return ModelTask(purpose=PURPOSE,
                     system=(FHIR_SYSTEM if case.kind == "fhir" else SYSTEM).format(
                         max_actor=max_actor, max_summariser=max_summariser),
                     prompt=lesson_prompt(case, answer, fb, shown), response=ExperienceDraft,
                     offline=lambda: offline_lessons(case, answer, fb))
