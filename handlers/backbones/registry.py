"""Which backbones there are, how each is built, and whether its replies are recorded exchanges.

Built-ins are listed here; a third party registers one through the `grandrounds.backbones` entry-point
group (handlers/plugins.py), naming a `BackboneRegistration`. Lazy (module paths, imported on first
use) like the policies' registry, so that building the sim backbone never imports the model client.

`recorded` is the fact verify and replay act on: a run of a recorded backbone is re-executed from its
own `llm.exchange` events (the record backend serves them by request hash, no model is called), so its
factory must accept `recorded=` (RecordedExchanges) and `live_fallthrough=` and serve from them; a run
of a backbone that is not recorded is re-executed by building the backbone again (only `sim` today:
replay/verify.py re-executes no other unrecorded backbone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from grandrounds.handlers.plugins import Registry, load_path

GROUP = "grandrounds.backbones"


@dataclass(frozen=True)
class BackboneRegistration:
    factory: Callable[..., Any] | str
    """Called as `factory(name, model, **options)` and returns the backbone (handlers/backbones/base.py
    `Backbone`); options are those of `make_backbone`, and a factory ignores the ones it does not take.
    A string is a `module:attr` path, imported on first use."""
    recorded: bool = False
    """Whether the backbone's replies are recorded exchanges (verify and replay serve them from the record)."""

    def build(self, name: str, model: str | None, **options: Any) -> Any:
        factory = load_path(self.factory) if isinstance(self.factory, str) else self.factory
        return factory(name, model, **options)


def _check(obj: Any) -> BackboneRegistration:
    if not isinstance(obj, BackboneRegistration):
        raise TypeError(f"names a {type(obj).__name__}, not a "
                        "grandrounds.handlers.backbones.registry.BackboneRegistration")
    return obj


_BUILTINS = {
    # name: its registration (below), by path so a lookup imports nothing else
    "sim": "grandrounds.handlers.backbones.registry:SIM",
    "openai": "grandrounds.handlers.backbones.registry:OPENAI",
    "record": "grandrounds.handlers.backbones.registry:RECORD",
    "agent": "grandrounds.handlers.backbones.registry:AGENT",
}
SIM = BackboneRegistration("grandrounds.handlers.backbones.sim:build_sim_backbone")
OPENAI = BackboneRegistration("grandrounds.handlers.backbones.build:build_model_backbone", recorded=True)
RECORD = BackboneRegistration("grandrounds.handlers.backbones.build:build_model_backbone", recorded=True)
AGENT = BackboneRegistration("grandrounds.handlers.backbones.agent:build_agent_backbone", recorded=True)
"""An agent's replies are recorded exchanges too (handlers/backbones/agent.py)."""

BACKBONE_REGISTRY: Registry[BackboneRegistration] = Registry("backbone", GROUP, _BUILTINS, _check)


def known_backbones() -> list[str]:
    return BACKBONE_REGISTRY.names()


def registration(name: str) -> BackboneRegistration:
    """KeyError for a name nobody registered; RegistryError (naming it) for a broken entry point."""
    return BACKBONE_REGISTRY.get(name)


def is_recorded(name: str) -> bool:
    """Whether runs of backbone `name` are re-executed from their recorded exchanges (False: unknown)."""
    return name in BACKBONE_REGISTRY and registration(name).recorded


class RecordedBackbones:
    """The names of the recorded backbones, read from the registry at each use (so a backbone
    registered after import counts): `name in RECORDED_BACKBONES`, iteration, `len`."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and is_recorded(name)

    def __iter__(self) -> Iterator[str]:
        return iter([n for n in known_backbones() if registration(n).recorded])

    def __len__(self) -> int:
        return len(list(iter(self)))

    def __repr__(self) -> str:
        return f"RecordedBackbones({tuple(self)!r})"
