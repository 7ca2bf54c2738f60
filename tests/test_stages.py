"""The stage machine (handlers/stages.py): defined once, driven by both transports."""

from __future__ import annotations

import ast
from pathlib import Path

from grandrounds.handlers.stages import STAGES, CaseProgress, next_stage
from grandrounds.store import event_types as ev
from grandrounds.store.llm_events import CaseFailed

ROOT = Path(__file__).resolve().parents[1]

MEM = ev.MemoryRetrieved(memory_seq=-1)
ANS = ev.AnswerGiven(answer="A", source="lexical")
FB = ev.FeedbackRecorded(answer="A", gold="A", correct=True)
REFL = ev.ReflectionRecorded(summary="s", guideline="g")


def _failed(stage: str) -> CaseFailed:
    return CaseFailed(stage=stage, reason="x")


def test_the_order_of_a_case_that_goes_through_every_stage():
    p, seen = CaseProgress(), []
    outputs = {"retrieve": ("memory", MEM), "act": ("answer", ANS), "feedback": ("feedback", FB),
               "reflect": ("reflection", REFL), "govern": ("completed", ev.CaseCompleted(index=0, correct=True))}
    while (stage := next_stage(p)) is not None:
        seen.append(stage)
        setattr(p, *outputs[stage])
    assert tuple(seen) == STAGES and p.done


def test_skips_and_terminal_state():
    # act failed: no feedback, reflection or governance from the case, straight to govern
    assert next_stage(CaseProgress(memory=MEM, failed=_failed("act"))) == "govern"
    # reflect failed, or ran and wrote nothing: on to govern
    assert next_stage(CaseProgress(memory=MEM, answer=ANS, feedback=FB, failed=_failed("reflect"))) == "govern"
    assert next_stage(CaseProgress(memory=MEM, answer=ANS, feedback=FB, reflected=True)) == "govern"
    # a case read back from the log whose reflect wrote nothing reflects again (writes nothing again)
    assert next_stage(CaseProgress(memory=MEM, answer=ANS, feedback=FB)) == "reflect"
    assert next_stage(CaseProgress(completed=ev.CaseCompleted(index=0, correct=False))) is None


def test_the_stage_order_is_written_once():
    """No module but handlers/stages.py spells out the five stages, and no transport decides what comes next."""
    spelled = []
    for top in ("store", "handlers", "streams", "replay", "grandrounds"):
        for path in (ROOT / top).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Tuple, ast.List)) and [getattr(e, "value", None) for e in node.elts] == list(STAGES):
                    spelled.append(str(path.relative_to(ROOT)))
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "next_stage":
                    spelled.append(f"{path.relative_to(ROOT)}:next_stage")
    assert set(spelled) == {"handlers/stages.py", "handlers/stages.py:next_stage"}  # STAGES and the Stage type
