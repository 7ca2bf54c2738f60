"""RetroSum's experience bank: parameters (seed 002; DESIGN §6).

The retrospective summariser itself is part of the agent loop (handlers/agent/retrosum.py):
its window w = 10 is the agent's `summary_every` (`grandrounds run --summary-every`), not a
policy field, because it applies to every policy run with a model backbone. What this
config holds is the experience bank: what is learnt after each case and how it is retrieved.
Where the paper is silent we use the published code's value (BlueZeros/AgentEHR,
`MCPRetroSumAgent` / `RetroSumEvolving`), and say so per field.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from grandrounds.handlers.policies.config import PolicyBase


class RetroSumPolicy(PolicyBase):
    """RetroSum (AgentEHR): an experience bank of actor and summariser lessons keyed by patient context."""

    name: Literal["retrosum"] = "retrosum"
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
    }
    recorded_defaults: ClassVar[dict[str, Any]] = {"answer_lessons_floor": -1.0, "review_lessons": False}
