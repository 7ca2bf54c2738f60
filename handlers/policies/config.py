"""Policy configuration: presets and TOML files, validated by pydantic.

Defaults are the papers' numbers (DESIGN §6). Where a paper leaves a value open we say so
next to the field.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EvoMedAgentPolicy(_Config):
    """Evo-MedAgent: episodic E, procedural rules S, tool governance G."""

    name: Literal["evo-medagent"] = "evo-medagent"
    episodic: bool = True
    """Store and retrieve episodes (ablation: procedural only = false)."""
    procedural: bool = True
    """Store and retrieve priority rules (ablation: episodic only = false)."""
    governance: bool = True
    """Track tool records and relabel tools."""
    writing: bool = True
    """Reflect and write memory at all (false freezes memory: offline test mode)."""
    top_k_episodes: int = Field(3, ge=0)
    """K_E; the paper leaves it open, 3 as in the published code."""
    top_k_rules: int = Field(5, ge=0)
    """K_S; the paper leaves it open, 5 as in the published code."""
    candidate_pool: int = Field(32, ge=1)
    """Rules scored per case: the nearest by cosine (HNSW above the exact limit)."""
    w_relevance: float = 0.4
    w_utility: float = 0.4
    w_priority: float = 0.2
    priority_bonus: tuple[float, float, float] = (0.2, 0.1, 0.0)
    """Bonus for priority 0, 1, 2 (0 = highest clinical urgency)."""
    exploration_c: float = 0.15
    untested_utility: float = 0.8
    duplicate_cosine: float = 0.85
    """A proposed rule this close to an active one escalates that rule's priority instead."""
    trusted_min_uses: int = 6
    trusted_helpful_rate: float = 0.70
    avoid_min_uses: int = 10
    avoid_bad_rate: float = 0.60
    misuse_weight: float = 0.5


class NoMemoryPolicy(_Config):
    """Memory-free ReAct baseline: the same pipeline, nothing retrieved or written."""

    name: Literal["none"] = "none"


PolicyConfig = Annotated[Union[EvoMedAgentPolicy, NoMemoryPolicy], Field(discriminator="name")]
_ADAPTER: TypeAdapter[PolicyConfig] = TypeAdapter(PolicyConfig)

PRESETS: dict[str, PolicyConfig] = {
    "evo-medagent": EvoMedAgentPolicy(),
    "none": NoMemoryPolicy(),
}


class PolicyError(ValueError):
    pass


def policy_from_dict(data: dict, source: str = "policy") -> PolicyConfig:
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise PolicyError(f"{source}: field {field!r}: {err['msg']}") from None


def load_policy(spec: str) -> PolicyConfig:
    """A preset name, or a TOML file whose `name` picks the policy and whose keys override defaults."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.exists():
        raise PolicyError(f"unknown policy {spec!r}: not a preset ({', '.join(PRESETS)}) and no such file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{spec}: not valid TOML ({exc})") from None
    return policy_from_dict(data, source=spec)


def policy_to_dict(policy: PolicyConfig) -> dict:
    return policy.model_dump(mode="json")
