"""Counterfactual replays: the same case log under another policy, an ablation, another backbone.

An ablation is a named switch over the policy's fields, declared by each policy config
(`ablations`: the papers' tables and the other switches DESIGN §6 lists); `--set KEY=VALUE` changes any other
field. Everything is validated by the policy model, so a typo is bad input, not a silent
no-op.
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
import json

from grandrounds.handlers.policies.config import PolicyConfig, PolicyError, policy_from_dict, policy_to_dict, with_ablations
from grandrounds.handlers.runs import RunSpec
from grandrounds.store.canonical import content_hash

class CounterfactualError(InvalidInput, ValueError):
    """A policy override that cannot apply (bad input: exit code 2)."""


def _parse_value(raw: str):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw  # a bare word: let the policy model decide whether a string fits


def apply_overrides(policy: PolicyConfig, ablations: list[str], sets: list[str]) -> PolicyConfig:
    if not ablations and not sets:
        return policy
    if ablations and not policy.ablations:
        raise CounterfactualError(f"policy {policy.name!r} has no ablation switches")
    try:
        policy = with_ablations(policy, ablations)
    except PolicyError as exc:
        raise CounterfactualError(str(exc)) from None
    data = policy_to_dict(policy)
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise CounterfactualError(f"--set {item!r}: expected KEY=VALUE, e.g. top_k_rules=3")
        key = key.strip()
        if key == "name" or key not in data:
            raise CounterfactualError(f"--set {item!r}: the policy has no field {key!r}")
        data[key] = _parse_value(raw.strip())
    try:
        return policy_from_dict(data, source="--set/--ablation")
    except PolicyError as exc:
        raise CounterfactualError(str(exc)) from None


def derived_spec(source_spec: RunSpec, source_run: str, policy: PolicyConfig | None = None,
                 backbone: str | None = None, model: str | None = None,
                 ablations: list[str] | None = None, sets: list[str] | None = None) -> RunSpec:
    """The source run's spec with the overrides applied and `source` naming the parent run."""
    pol = apply_overrides(policy if policy is not None else source_spec.policy, ablations or [], sets or [])
    return source_spec.model_copy(update={
        "policy": pol,
        "backbone": backbone or source_spec.backbone,
        "model": model if model is not None else source_spec.model,
        "source": source_run,
    })


def is_counterfactual(source_spec: RunSpec, spec: RunSpec) -> bool:
    """Whether `spec` changes anything but `source` (then its runs need their own ids)."""
    return spec.model_copy(update={"source": source_spec.source}) != source_spec


def variant_tag(spec: RunSpec, ablations: list[str] | None = None) -> str:
    """A short, stable name for a counterfactual configuration: what changed + spec hash."""
    what = "+".join(ablations) if ablations else spec.policy.name
    return f"{what}-{content_hash(spec.model_dump(mode='json'))[:6]}"
