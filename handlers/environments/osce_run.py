"""`grandrounds run CASES.jsonl --env agentclinic`: AgentClinic OSCE cases through the five stages.

Validates the options and the case file before anything runs (exit 2 naming the problem), names the
environment in the run's spec (`OsceEnvironmentRecord`: the case file by content and the turn budget,
hashed into `RunSpec.source`; the file's path goes to the `run.started` meta so `grandrounds verify`
can build the environment again).
"""

from __future__ import annotations


from grandrounds.handlers.environments.run_setup import EnvRunSetup, refuse_unsupported
from grandrounds.handlers.environments.osce_env import OsceEnvironmentRecord

SUPPORTED_POLICIES = ("evo-medagent", "none")
"""Policies whose stages handle OSCE dialogues; another is refused up front (exit 2)."""
SIM_NOTE = ("sim backbone: scripted doctor (fixed questions, each recorded test group, then the diagnosis a memory "
            "rule favours or that best overlaps the dialogue), rule-based patient, string-match grading — "
            "offline plumbing, its accuracy is not a clinical measure")


def _open(record: OsceEnvironmentRecord):
    from grandrounds.handlers.environments.osce_env import open_environment

    return open_environment(record)


def prepare_agentclinic(cases_file: str, max_turns: int | None, limit: int | None, policy_name: str,
                        sim_tools: tuple[str, ...], broker: str, mab_given: list[str], judge_model: str | None = None,
                        judge_base_url: str | None = None) -> EnvRunSetup:
    """Everything checked before a run starts; ValueError / CaseFileError name the problem (exit 2)."""
    from grandrounds.handlers.environments.agentclinic_osce import load_osce_cases
    from grandrounds.handlers.environments.base import FileRef

    if mab_given:
        raise ValueError(f"{', '.join(mab_given)}: only with --env medagentbench (MedAgentBench FHIR tasks)")
    refuse_unsupported("agentclinic", "AgentClinic OSCE cases", policy_name, SUPPORTED_POLICIES, sim_tools,
                       "OSCE cases use the patient and the measurement tool", broker)
    if judge_base_url and not judge_model:
        raise ValueError("--judge-base-url needs --judge-model")
    cases = load_osce_cases(cases_file, limit)
    record = OsceEnvironmentRecord(cases=FileRef.of(cases_file), max_turns=max_turns or 20, judge_model=judge_model)
    return EnvRunSetup(cases, record, _open)
