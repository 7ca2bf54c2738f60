"""The memory of policies other than Evo-MedAgent, as projection parts.

A part is the fold of one policy's events plus its vector indexes (`SkillMemory`,
`SelsmMemory`, `ExperienceMemory`). The projection creates the part named by the run's
policy when it sees `run.started`, feeds it every event after the common fold, and saves
it with the checkpoint (store/safe_codec.py). Parts are looked up lazily so that a log of one policy never
imports another's code.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Protocol

import numpy as np

from grandrounds.store.events import EventPayload

Embed = Callable[[str], np.ndarray]

_PARTS: dict[str, str] = {
    "skemex": "grandrounds.store.skill_memory:SkillMemory",
    "selsm": "grandrounds.store.selsm_memory:SelsmMemory",
    "retrosum": "grandrounds.store.experience_memory:ExperienceMemory",
}


class PolicyMemory(Protocol):
    def apply(self, seq: int, payload: EventPayload, embed: Embed) -> None:
        """Fold one event (every event of the run arrives here, in seq order)."""
        ...

    def counts(self) -> dict[str, Any]:
        """Memory counts for run summaries (merged into `memory` of the run summary)."""
        ...


def import_part(policy_name) -> None:
    """Import the module of a policy's memory part, so a checkpoint naming its classes can load them
    (the checkpoint codec never imports anything itself)."""
    path = _PARTS.get(policy_name) if isinstance(policy_name, str) else None
    if path is not None:
        importlib.import_module(path.partition(":")[0])


def part_for(policy_name: str, dim: int, exact_limit: int) -> PolicyMemory | None:
    path = _PARTS.get(policy_name)
    if path is None:
        return None
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)(dim, exact_limit)
