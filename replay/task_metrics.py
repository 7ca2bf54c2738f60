"""Per-run task metrics of the SELSM paper (§2.5), computed from a run's events.

Pure functions: they take events (anything with `.type`, `.case_id` and a `.payload` dict, as
`EventStore.iter` yields) and never touch a store, a clock or a model. N is the number of
`case.received` events. How each quantity maps to our events:

- completed(dᵢ): an `answer.given` was recorded for the case — the agent loop ended with an
  answer within its step budget, including the final-step fallback (an answer aligned from
  untagged text, source `llm:fallback:statement|conclusion`), which is how our protocol finishes.
  An answer with source `none` (the agent gave no valid answer; graded wrong and reflected on) is
  not completed and counts as a timeout, as an act `case.failed` "no valid answer" did before. An `act`-stage
  `case.failed` means not completed.
- success(dᵢ): completed and graded correct (`case.completed.correct`, which is the exact-match
  grade of `feedback.recorded`). So for MCQ runs SR = 100 × the summary's `accuracy`.
- Tᵢ (turns): model turns of the agent loop = `AgentStep`s of kind `reasoning` in the case's
  `answer.given` (or act `case.failed`) trajectory; the openai agent records exactly one per
  turn, RetroSum summaries (`summary` steps) are not turns. The sim backbone records its own
  reasoning steps, so its turn counts mean less. Tool calls: steps of kind `tool` (executed).
  `avg_turns` and `avg_tool_calls` are means over all N tasks (the paper's Fig. 3d).
- T_min: 1 for MCQ (a `<response>` on the first turn); a parameter for tasks whose minimum
  interaction cycle is longer.
- invalid(dᵢ), timeout(dᵢ) for ER: SELSM counts tasks ended by an invalid action and tasks that
  hit the interaction limit. Read from the act `case.failed`'s typed `termination`:
  `invalid_action` (the official MedAgentBench protocol ends on a reply that starts with no
  action; our ReAct loops never do: they answer with a corrective observation), `turn_limit` (the
  budget ran out: MCQ, FHIR and OSCE loops) and `error` (a model unreachable after retries, a
  failed summary), which is neither and so not counted against ER (`errors`). Logs from before
  the field fall back to the reason's text.
- T_min for OSR: 1 for MCQ; a FHIR task's own (`feedback.recorded.min_rounds`: the reference
  solution's rounds for the task's data: its reads, the POSTs it requires, then FINISH).
- Turns: `reasoning` steps; AgentClinic dialogues record doctor turns as `tool`/`response` steps.
- cᵢ (tokens): prompt + completion tokens of the case's successful `llm.exchange`s, all stages
  (act, RetroSum, reflect); failed attempts carry no usage. `act_tokens_per_correct_task`
  counts the act stage only (the agent's episode proper, as in SELSM).

Not computable on MCQ runs: Q-SR, A-SR and hence QAB need SELSM's partition into query tasks
(information retrieval) and action tasks (state-modifying FHIR POSTs); an MCQ case is neither,
so they are None until a run holds classified tasks (`classify` maps a `case.received` case to
`"query"`, `"action"` or None). QAB is None when Q-SR or A-SR is, or both are 0 (0/0).

TC, SR, Q-SR, A-SR and OSR are percentages, ER and QAB fractions, as in the paper.
"""

from __future__ import annotations

from collections import Counter

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Protocol

TaskClass = Literal["query", "action"]

EVENT_TYPES = ("case.received", "answer.given", "case.failed", "case.completed", "llm.exchange", "feedback.recorded")
"""What the metrics read: pass `types=EVENT_TYPES` to `EventStore.iter` to read no more."""


class EventLike(Protocol):
    type: str
    case_id: str | None
    payload: dict[str, Any]


def task_class(case: dict[str, Any]) -> TaskClass | None:
    """SELSM's query/action partition. MCQ cases are neither (no FHIR task types yet)."""
    return None


@dataclass(frozen=True)
class TaskRecord:
    case_id: str
    task_class: TaskClass | None
    completed: bool
    success: bool
    turns: int
    tool_calls: int
    timeout: bool
    invalid: bool
    fallback: bool
    """Answered by aligning the final step's untagged text (no valid `<response>`)."""
    tokens: int
    act_tokens: int
    error: bool = False
    """Ended by an error (model unreachable after retries, a failed summary): neither an invalid
    action nor the turn limit, so not counted against ER."""
    t_min: int | None = None
    """This task's minimal rounds (its reference solution's), when known; else `osr`'s t_min."""
    source: str | None = None
    """`answer.given`'s source: which rule produced the answer (`none`: the agent gave no answer)."""


def task_records(events: Iterable[EventLike],
                 classify: Callable[[dict[str, Any]], TaskClass | None] = task_class) -> list[TaskRecord]:
    """One record per `case.received`, in stream order."""
    order: list[str] = []
    acc: dict[str, dict[str, Any]] = {}

    def row(cid: str) -> dict[str, Any]:
        return acc.setdefault(cid, {"cls": None, "answer": None, "failed": None, "correct": False,
                                    "tokens": 0, "act_tokens": 0, "t_min": None})

    for e in events:
        if e.case_id is None:
            continue
        p = e.payload
        if e.type == "case.received":
            order.append(e.case_id)
            row(e.case_id)["cls"] = classify(p["case"])
        elif e.type == "answer.given":
            row(e.case_id)["answer"] = p
        elif e.type == "case.failed" and p["stage"] == "act":
            row(e.case_id)["failed"] = p
        elif e.type == "case.completed":
            row(e.case_id)["correct"] = bool(p["correct"])
        elif e.type == "feedback.recorded" and p.get("min_rounds") is not None:
            row(e.case_id)["t_min"] = int(p["min_rounds"])
        elif e.type == "llm.exchange" and p.get("outcome") == "ok":
            usage = p.get("usage") or {}
            n = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
            r = row(e.case_id)
            r["tokens"] += n
            if p.get("stage") == "act":
                r["act_tokens"] += n
    out = []
    for cid in order:
        r = acc[cid]
        answer, failed = r["answer"], r["failed"]
        steps = (answer or failed or {}).get("steps", [])
        unanswered = answer is not None and answer.get("source") == "none"  # graded wrong, still reflected on
        completed = answer is not None and failed is None and not unanswered
        ending = termination(failed) if failed is not None else ("turn_limit" if unanswered else None)
        out.append(TaskRecord(
            case_id=cid, task_class=r["cls"], completed=completed, success=completed and r["correct"],
            turns=turns_of(steps), tool_calls=sum(s["kind"] == "tool" for s in steps),
            timeout=ending == "turn_limit", invalid=ending == "invalid_action",
            fallback=answer is not None and str(answer.get("source", "")).startswith("llm:fallback"),
            tokens=r["tokens"], act_tokens=r["act_tokens"], error=ending == "error", t_min=r["t_min"],
            source=answer.get("source") if answer is not None else None))
    return out


_LIMIT_REASONS = ("no valid answer", "no FINISH", "no_diagnosis")


def termination(failed: dict[str, Any]) -> str:
    """Why an act `case.failed` ended the episode: its typed `termination`; logs written before the
    field existed fall back to the reason's text (the turn-limit messages; anything else an error)."""
    if failed.get("termination"):
        return failed["termination"]
    return "turn_limit" if failed["reason"].startswith(_LIMIT_REASONS) else "error"


def turns_of(steps: list[dict[str, Any]]) -> int:
    """Model turns: one `reasoning` step per turn where the loop records them (MCQ, FHIR); a dialogue
    (AgentClinic) records each doctor turn as a `tool` step (question or test) or the final `response`."""
    n = sum(s["kind"] == "reasoning" for s in steps)
    return n if n else sum(s["kind"] in ("tool", "response") for s in steps)


def _pct(hits: int, n: int) -> float | None:
    return round(100.0 * hits / n, 6) if n else None


def tc(records: list[TaskRecord]) -> float | None:
    """Task Completion (Eq. 10), percent."""
    return _pct(sum(r.completed for r in records), len(records))


def sr(records: list[TaskRecord], cls: TaskClass | None = None) -> float | None:
    """Success Rate (Eq. 11), or Q-SR / A-SR (Eq. 12, 13) over one task class; None if empty."""
    pool = records if cls is None else [r for r in records if r.task_class == cls]
    return _pct(sum(r.success for r in pool), len(pool))


def osr(records: list[TaskRecord], t_min: int = 1) -> float | None:
    """One-Shot correct Rate (Eq. 14), percent: successes in exactly T_min turns (the record's own
    `t_min` where known, else `t_min`)."""
    return _pct(sum(r.success and r.turns == (r.t_min if r.t_min is not None else t_min) for r in records),
                len(records))


def er(records: list[TaskRecord]) -> float | None:
    """Error Robustness (Eq. 15): 1 − r_inv − r_lim, a fraction."""
    if not records:
        return None
    n = len(records)
    return round(1.0 - sum(r.invalid for r in records) / n - sum(r.timeout for r in records) / n, 6)


def qab(q_sr: float | None, a_sr: float | None) -> float | None:
    """Query-Action Balance (Eq. 16); None when either rate is missing or both are 0."""
    if q_sr is None or a_sr is None or max(q_sr, a_sr) == 0:
        return None
    return round(1.0 - abs(q_sr - a_sr) / max(q_sr, a_sr), 6)


def tokens_per_correct(records: list[TaskRecord], act_only: bool = False) -> float | None:
    """Token cost per correct task (Eq. 17): mean cᵢ over successes; None without one."""
    wins = [r.act_tokens if act_only else r.tokens for r in records if r.success]
    return round(sum(wins) / len(wins), 3) if wins else None


def _mean(values: list[int]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


def task_metrics(events: Iterable[EventLike], t_min: int = 1,
                 classify: Callable[[dict[str, Any]], TaskClass | None] = task_class) -> dict[str, Any]:
    """The `metrics` object of a non-sim run summary."""
    records = task_records(events, classify)
    n = len(records)
    q, a = sr(records, "query"), sr(records, "action")
    missing = {}
    if q is None or a is None:
        missing["q_sr/a_sr/qab"] = "needs query/action tasks (FHIR); MCQ cases are neither"
    return {
        "n": n, "tc": tc(records), "sr": sr(records), "q_sr": q, "a_sr": a, "osr": osr(records, t_min),
        "t_min": t_min, "er": er(records),
        "r_inv": round(sum(r.invalid for r in records) / n, 6) if n else None,
        "r_lim": round(sum(r.timeout for r in records) / n, 6) if n else None,
        "errors": sum(r.error for r in records),
        "qab": qab(q, a),
        "tokens_per_correct_task": tokens_per_correct(records),
        "act_tokens_per_correct_task": tokens_per_correct(records, act_only=True),
        "avg_turns": _mean([r.turns for r in records]),
        "avg_tool_calls": _mean([r.tool_calls for r in records]),
        "fallback_answers": sum(r.fallback for r in records),
        "unanswered": sum(r.source == "none" for r in records),
        "answer_sources": dict(sorted(Counter(r.source for r in records if r.source).items())),
        "not_computed": missing,
    }


def osce_metrics(results: list, with_tokens: bool) -> dict:
    """SELSM §2.5 quantities over AgentClinic results (`handlers.agent.osce_runner.OsceResult`): completion = a diagnosis was
    given; turns = doctor turns; tool calls = tests requested; timeout = no diagnosis within the
    budget; invalid = a model was unreachable. T_min is 1 (a diagnosis on the first turn)."""
    records = [TaskRecord(case_id=r.case_id, task_class=None, completed=r.status == "diagnosed",
                          success=r.status == "diagnosed" and r.correct, turns=r.turns,
                          tool_calls=len(r.tests_requested), timeout=r.status == "no_diagnosis",
                          invalid=False, fallback=False, tokens=r.tokens, act_tokens=r.doctor_tokens,
                          error=r.status == "failed")
               for r in results]
    n = len(records) or 1
    return {"tc": tc(records), "sr": sr(records), "osr": osr(records), "er": er(records),
            "tokens_per_correct_task": tokens_per_correct(records) if with_tokens else None,
            "doctor_tokens_per_correct_task": tokens_per_correct(records, act_only=True) if with_tokens else None,
            "avg_turns": round(sum(r.turns for r in records) / n, 3),
            "avg_tests": round(sum(r.tool_calls for r in records) / n, 3),
            "judged_by_llm": sum(r.judge == "llm" for r in results),
            "judged_by_string_match": sum(r.judge == "string-match" for r in results)}
