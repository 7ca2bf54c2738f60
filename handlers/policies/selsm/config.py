"""SELSM's parameters, at the paper's values (seed 000 §2.2–2.4, §3.1; DESIGN §6)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from grandrounds.handlers.policies.config import PolicyBase


class SelsmPolicy(PolicyBase):
    """State-Enhanced Logical-Skill Memory: step-judged, entity-agnostic logical skills in records
    R = (query, transitions), retrieved query-anchored in two stages before every decision."""

    name: Literal["selsm"] = "selsm"
    writing: bool = True
    """Judge trajectories and write records at all (false freezes memory: offline test mode)."""
    top_q_records: int = Field(5, ge=1)
    """Q: records kept by query cosine in stage 1 (task-level filtering); the paper's 5."""
    state_threshold: float = Field(0.9, ge=-1.0, le=1.0)
    """θ: pooled transitions whose state cosine is below this are dropped in stage 2; the paper's 0.9."""
    top_m_skills: int = Field(1, ge=0)
    """M: skills injected before each decision, ranked by (state cosine, round index) descending; the paper's 1."""
    train_samples: int = Field(3, ge=1)
    """K: trajectories judged per task while memory is written (the graded one plus K-1 sampled
    re-runs with their own seeded randomness); the paper's 3."""
    two_stage: bool = True
    """Query-anchored two-stage retrieval (false: transitions by state cosine alone across all records)."""
    operational_logic: bool = True
    """Keep the Generalized Logic (and Error Avoidance) part of skills (false: scenario and example only)."""
    reasoning_trace: bool = True
    """Show the agent's reasoning to the step judge (false: actions and observations only)."""
    state_view: int = Field(2, ge=1, le=2)
    """What of a state is embedded (state_view.py): 2, a slice that fits the embedder's window (the query's
    head, the latest steps, observations abbreviated); 1, the whole text, which all-MiniLM-L6-v2 cut at 256
    wordpieces so states past the first FHIR response embedded alike (runs recorded before issue 44). The
    paper embeds s_t whole, with an embedder that reads it whole: this is the departure our window needs."""
    transition_pool: int = Field(64, ge=1)
    """Without two-stage retrieval: nearest transitions by state cosine scored before θ and the
    (score, round) ranking. Not in the paper (which ranks all); exact below the index's exact limit."""

    recorded_defaults: ClassVar[dict[str, Any]] = {"state_view": 1}
    code_version: ClassVar[int] = 2
    """2: states embedded through `state_view` (issue 44); 1 before."""
    ablations: ClassVar[dict[str, dict[str, Any]]] = {
        "no-writing": {"writing": False},
        "no-operational-logic": {"operational_logic": False},
        "no-reasoning-trace": {"reasoning_trace": False},
        "no-two-stage": {"two_stage": False},
        "whole-state": {"state_view": 1},
    }
