"""Entity-agnostic descriptions of a MedAgentBench FHIR trajectory, for the policies' offline writers.

The `sim` backbone's model tasks (SkeMex's distillation, SELSM's step judge, RetroSum's lessons) were
written for MCQ cases, where the lesson names the gold option's text. A FHIR task has no options: its
gold is the official grader's verdict on the calls made and the FINISH payload. What transfers to the
next task of the same template is the action pattern, so these helpers describe it generically — the
template's key terms (`template_terms`: no quoted values, names, MRNs or dates) and the calls by method,
resource type and parameter / field names only ("GET Patient?identifier=…", never a host, an id or a
value) — so what they write passes SELSM's entity checker and stays valid for other patients.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qsl, urlsplit

from grandrounds.store.event_types import AgentStep

ELIDED = "…"
"""Stands for a parameter's value: the pattern names the parameter, never this task's value."""


def fhir_terms(instruction: str) -> list[str]:
    """The task template's key terms (key_terms-style, without the instance's values)."""
    from grandrounds.handlers.environments.medagentbench import template_terms

    return template_terms(instruction)


def describe_call(content: str) -> str:
    """One recorded `tool` step (the environment's call record) as `GET Patient?identifier=…` or
    `POST Observation (fields: code, status, …)`; a step that is not a call record by its name."""
    try:
        c = json.loads(content)
    except json.JSONDecodeError:
        return "a FHIR call"
    if not isinstance(c, dict):
        return "a FHIR call"
    if "method" not in c or "url" not in c:
        return f"the {c.get('name', 'FHIR')} function"
    parts = urlsplit(str(c["url"]))
    resource = parts.path.rstrip("/").rsplit("/", 1)[-1] or "resource"
    refused = "" if c.get("accepted", True) else " (refused)"
    if c["method"] == "POST":
        payload = c.get("payload") if isinstance(c.get("payload"), dict) else {}
        fields = ", ".join(sorted(k for k in payload if k != "resourceType"))
        return f"POST {resource}" + (f" (fields: {fields})" if fields else "") + refused
    names = [k for k, _ in parse_qsl(parts.query, keep_blank_values=True) if k != "_format"]
    query = "&".join(f"{k}={ELIDED}" for k in dict.fromkeys(names))
    return f"{c['method']} {resource}" + (f"?{query}" if query else "") + refused


def finish_shape(answer: str) -> str:
    """The FINISH payload's shape, without its values."""
    try:
        value = json.loads(answer)
    except (json.JSONDecodeError, TypeError):
        return "FINISH with a free-text answer"
    if not isinstance(value, list):
        return "FINISH with a single value"
    return {0: "FINISH([]) with an empty list", 1: "FINISH with a one-value list"}.get(
        len(value), "FINISH with a list of several values")


def calls_of(steps: list[AgentStep]) -> list[str]:
    return [describe_call(s.content) for s in steps if s.kind == "tool"]


def procedure(steps: list[AgentStep], answer: str) -> str:
    """`GET Patient?identifier=…, then FINISH with a one-value list`: the trajectory's action pattern."""
    return ", then ".join([*calls_of(steps), finish_shape(answer)])


def task_label(terms: list[str]) -> str:
    return f"FHIR tasks like '{' '.join(terms)}'" if terms else "FHIR tasks of this template"


def verdict_line(correct: bool) -> str:
    return ("the official grader accepted this pattern" if correct else
            "the official grader refused this pattern: check the resource, the search parameters, the payload "
            "fields and the FINISH list the task asks for before repeating it")
