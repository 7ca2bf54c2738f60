"""Which config class and which mechanism implement each policy name.

Lazy (module paths, imported on first use) so that reading a log of one policy never
imports the others' dependencies, and so that adding a policy is one line here.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

_POLICIES: dict[str, tuple[str, str]] = {
    # name: (config class, mechanism class)
    "evo-medagent": ("grandrounds.handlers.policies.config:EvoMedAgentPolicy", "grandrounds.handlers.policies.evo_medagent.policy:EvoMedAgentMemory"),
    "none": ("grandrounds.handlers.policies.config:NoMemoryPolicy", "grandrounds.handlers.policies.base:NoMemory"),
    "skemex": ("grandrounds.handlers.policies.skemex.config:SkeMexPolicy", "grandrounds.handlers.policies.skemex.policy:SkeMexMemory"),
    "selsm": ("grandrounds.handlers.policies.selsm.config:SelsmPolicy", "grandrounds.handlers.policies.selsm.policy:SelsmMemory"),
    "precedent": ("grandrounds.handlers.policies.precedent:PrecedentPolicy",
                  "grandrounds.handlers.policies.precedent:PrecedentMemory"),
    "retrosum": ("grandrounds.handlers.policies.retrosum.config:RetroSumPolicy",
                 "grandrounds.handlers.policies.retrosum.policy:RetroSumMemory"),
    "long-context": ("grandrounds.handlers.policies.long_context.config:LongContextPolicy",
                     "grandrounds.handlers.policies.long_context.policy:LongContextMemory"),
}


def known_policies() -> list[str]:
    return list(_POLICIES)


@cache
def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def config_class(name: str) -> type:
    return _load(_POLICIES[name][0])


def mechanism_class(name: str) -> type:
    return _load(_POLICIES[name][1])


def make_mechanism(config: Any) -> Any:
    """The stage-facing implementation (a `handlers.policies.base.MemoryPolicy`) of a config."""
    return mechanism_class(config.name)(config)
