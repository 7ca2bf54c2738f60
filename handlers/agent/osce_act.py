"""The act of an AgentClinic OSCE case: the doctor dialogue (handlers/agent/osce_dialogue.py) run against
the environment's patient and measurement tool (handlers/environments/osce_env.py), recorded as the
pipeline records an answer. Here, above the environment, so the environment never imports an agent."""

from __future__ import annotations

from grandrounds.handlers.agent.osce_dialogue import LLMDoctor, SimDoctor, run_osce_dialogue
from grandrounds.handlers.environments.osce_env import SIM_FOLLOW_OVERLAP, OsceTools, adopted_rule, dialogue_steps
from grandrounds.handlers.llm.errors import CaseFailure
from grandrounds.store.event_types import AnswerGiven


async def run_osce_act(view, memory, tools: OsceTools, gateway=None, recorder=None,
                       patient_recorder=None, actions: str = "text") -> AnswerGiven:
    """The doctor dialogue of one case: the sim doctor (gateway None) or the model doctor, the run's
    memory as its memory block. No diagnosis (turn budget spent, a model unreachable) is a
    `CaseFailure` with the dialogue so far: the case counts as incorrect and writes no memory.
    `actions="schema"`: the model doctor's turns are schema-decoded; its answer's source is `model:schema`."""
    if gateway is None:
        doctor = SimDoctor(tools.differential, tools.test_menu, memory.prefix, follow_overlap=SIM_FOLLOW_OVERLAP)
    else:
        doctor = LLMDoctor(gateway, recorder, memory.prefix, actions)
    dialogue = await run_osce_dialogue(view, doctor, tools.patient(gateway, patient_recorder), tools.measurement,
                                       tools.max_turns)
    steps = dialogue_steps(dialogue.turns)
    if dialogue.status != "diagnosed":
        raise CaseFailure(f"{dialogue.status}: {dialogue.error}", steps,
                          "turn_limit" if dialogue.status == "no_diagnosis" else "error")
    diagnosis = dialogue.diagnosis or ""
    source = adopted_rule(memory, diagnosis) if diagnosis else None
    model_source = "model:schema" if actions == "schema" else "model"
    return AnswerGiven(answer=diagnosis, source=source or ("lexical" if gateway is None else model_source),
                       steps=steps)
