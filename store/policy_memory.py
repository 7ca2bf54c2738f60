"""The memory of policies other than Evo-MedAgent, as projection parts.

A part is the fold of one policy's events plus its vector indexes (`SkillMemory`,
`SelsmMemory`, `ExperienceMemory`, each in its policy's package under handlers/policies/). The
projection creates the part named by the run's policy when it sees `run.started`, feeds it every
event after the common fold, and saves it with the checkpoint (store/safe_codec.py). Policies register their part here
(`register_part`), so the store never imports the layer above it; a policy that registered nothing
is an error, never a silently empty memory.
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
from typing import Any, Callable, Protocol

import numpy as np

from grandrounds.store.events import EventPayload

Embed = Callable[[str], np.ndarray]



class UnknownPolicy(InvalidInput, LookupError):
    pass


class PolicyMemory(Protocol):
    def apply(self, seq: int, payload: EventPayload, embed: Embed) -> None:
        """Fold one event (every event of the run arrives here, in seq order)."""
        ...

    def counts(self) -> dict[str, Any]:
        """Memory counts for run summaries (merged into `memory` of the run summary)."""
        ...


PartFactory = Callable[[int, int], PolicyMemory]
"""(dim, exact_limit) -> a new, empty part."""

_PARTS: dict[str, PartFactory | None] = {}
_NO_RETRIEVAL: set[str] = set()


def register_part(policy_name: str, factory: PartFactory | None, retrieves: bool = True) -> None:
    """Declare the memory part of a policy; None: the policy keeps no memory of its own beyond the
    common fold (store/memory_state.py). `retrieves=False`: the policy never draws on memory, so
    its runs need no leakage guard, and the projection keeps no per-case content keys for it."""
    if policy_name in _PARTS and _PARTS[policy_name] is not factory:
        raise ValueError(f"policy {policy_name!r} registered two memory parts")
    _PARTS[policy_name] = factory
    if not retrieves:
        _NO_RETRIEVAL.add(policy_name)


def retrieves(policy_name: str) -> bool:
    """Whether the policy's runs consult memory (and with it the leakage guard by content)."""
    return policy_name not in _NO_RETRIEVAL


def import_part(policy_name) -> None:
    """A checkpoint names its part's classes, and the codec loads only classes already imported. A
    policy's part is imported when the policy registers it (grandrounds.handlers.policies.catalog), so
    nothing is imported here; a policy that registered nothing is refused, as by `part_for`."""
    if isinstance(policy_name, str) and policy_name not in _PARTS:
        raise UnknownPolicy(f"no memory fold registered for policy {policy_name!r} "
                            "(policies register theirs when grandrounds.handlers.policies is imported)")


def part_for(policy_name: str, dim: int, exact_limit: int) -> PolicyMemory | None:
    try:
        factory = _PARTS[policy_name]
    except KeyError:
        raise UnknownPolicy(f"no memory fold registered for policy {policy_name!r} "
                            "(policies register theirs when grandrounds.handlers.policies is imported)") from None
    return None if factory is None else factory(dim, exact_limit)
