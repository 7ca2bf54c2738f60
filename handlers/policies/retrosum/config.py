"""RetroSum: parameters (seed 002; DESIGN §6).

Two parts: the retrospective summaries the agent loops write (handlers/agent/retrosum.py drives
them; this config says how often, who looks back and whether the episode ends with one), and the
experience bank: what is learnt after each case and how it is retrieved. Where the paper is silent
we use the published code's value (BlueZeros/AgentEHR, `MCPRetroSumAgent` / `RetroSumEvolving`),
and say so per field.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional

from pydantic import Field

from grandrounds.handlers.policies.config import PolicyBase


class RetroSumPolicy(PolicyBase):
    """RetroSum (AgentEHR): an experience bank of actor and summariser lessons keyed by patient context."""

    name: Literal["retrosum"] = "retrosum"
    summary_every: Optional[int] = Field(3, ge=0)
    """w: a retrospective summary after every w-th agent step but the last (MCQ loop and the FHIR react
    loop; 0: none during the episode). The paper's w = 10 (published `sum_per_step` 10) is set against
    a 100-step budget in which its episodes run 20-40 turns, so a case gets two or three summaries; our
    loops stop after 7 steps (`--max-steps`), where w = 10 never fired (issue 44: 21 steps over 3 cases,
    0 summaries). w = 3 gives an episode that uses its budget two, after steps 3 and 6: a departure in
    the number, kept in the ratio of summaries to a full episode. None: the agent loop's
    `--summary-every`, the raw history without the previous summary and no end summary (runs recorded
    before issue 44)."""
    retrospect_context: Literal["both", "actor", "summariser"] = "both"
    """Who looks back over the whole history (the published `retrospect_context`, default both; the
    paper's ablation): `both`, the actor keeps every raw turn and the summariser re-reads them all;
    `actor`, the summariser reads only the steps since its previous summary; `summariser`, the actor
    sees the latest summary and only the turns after it."""
    end_summary: bool = True
    """Summarise once more when the episode ends; reflection reads that summary (the published
    `react` summarises after its loop and hands the summarised trajectory to the extractor)."""
    writing: bool = True
    """Distil and store an experience after each case (false: frozen bank).
    Offline test mode and the w/o-writing ablation set it false."""
    actor_lessons: bool = True
    """Show the retrieved experience's actor lessons to the actor.
    The published code's `memory_inject` = both / actor."""
    summariser_lessons: bool = True
    """Show the retrieved experience's summariser lessons to the retrospective summariser.
    The published code's `memory_inject` = both / summarizer."""
    top_k: int = Field(1, ge=0)
    """Experiences retrieved per case: the paper's "most similar memory" (top_k_retrieval = 1)."""
    min_similarity: float = Field(0.5, ge=-1.0, le=1.0)
    """Cosine between patient contexts below which nothing is retrieved (similarity_threshold = 0.5)."""
    max_actor_lessons: int = Field(10, ge=0)
    """At most this many actor lessons kept per experience (published code's max_memory_items).
    The paper gives no number; the published code caps each lesson list at 10."""
    max_summariser_lessons: int = Field(10, ge=0)
    """At most this many summariser lessons per experience (same cap, same source)."""
    learn_from_failures: bool = True
    """Distil lessons from wrong answers too (the published code's `extract_from_failures` = True)."""
    review_lessons: bool = True
    """An MCQ case's actor lessons pass the review gate before they are stored (precedents.review_text:
    not empty, not only an option's name or a finding of the case, no option letter, no other option
    than the confirmed answer taught). Not in the paper: the local model's lesson after a wrong answer
    restated the lesson it had been shown, of another diagnosis (issue 20). False: runs recorded
    before this field."""
    answer_lessons_floor: float = Field(0.7, ge=-1.0, le=1.0)
    """Cosine at or above which an actor lesson that names one of this case's options (its text, a
    letter, or a word of it that this case's question does not use) is shown; below it only lessons naming none of them are. Not in the paper: found with the
    local 1.5 B model (benchmarks/bench_real_model.py, issue 20). A lesson such as "a silent,
    hyperresonant side suggests a tension pneumothorax" from a past case of another diagnosis acted
    as the answer: retrosum online scored 8/28 where `none` scored 19/28. On the held-out recurring
    stream, MiniLM cosine does not separate diagnoses of one presentation below 0.7 (same diagnosis
    0.51-0.75, another up to 0.68), so a lesson carries its answer only to a nearly identical
    presentation; -1 shows every lesson (runs recorded before this field)."""

    ablations: ClassVar[dict[str, dict[str, Any]]] = {
        "no-writing": {"writing": False},
        # The paper's "RetroSum" row against "RetroSum (evolved)": retrospective summarisation
        # without the experience bank (published script retrosum_wo_memory).
        "no-experience": {"writing": False, "actor_lessons": False, "summariser_lessons": False},
        "no-actor-lessons": {"actor_lessons": False},
        "no-summariser-lessons": {"summariser_lessons": False},
        "answer-lessons-everywhere": {"answer_lessons_floor": -1.0},
        "no-lesson-review": {"review_lessons": False},
        # The paper's retrospection ablation (published retrospect_context).
        "retrospect-actor-only": {"retrospect_context": "actor"},
        "retrospect-summariser-only": {"retrospect_context": "summariser"},
        "no-retrospection": {"summary_every": 0, "end_summary": False},
    }
    recorded_defaults: ClassVar[dict[str, Any]] = {"answer_lessons_floor": -1.0, "review_lessons": False,
                                                   "summary_every": None, "retrospect_context": "both",
                                                   "end_summary": False}
    code_version: ClassVar[int] = 2
    """2: the policy's own retrospection (`summary_every`, `retrospect_context`, `end_summary`; issue 44); 1 before."""
