"""grandrounds: an event-sourced streaming learner giving clinical LLM agents an auditable memory.

The public API (`from grandrounds import Memory`):

- `Memory` / `AsyncMemory` (grandrounds/api.py): recall, record, feedback, history, explain, as_of,
  verify, replay over one namespace (run) of a DuckDB file.
- `AgentReply`, `AgentMemory`, `RecalledItem` (handlers/backbones/agent.py): what an agent given to
  `grandrounds run --agent module:callable` receives and may return.
- `Session` (streams/session.py): the composition root every driver of a run shares.

Exported lazily: the command line imports this package too, and must not pay for what it does not use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Memory": "grandrounds.api",
    "AsyncMemory": "grandrounds.api",
    "CaseInput": "grandrounds.api",
    "Recall": "grandrounds.api",
    "Recorded": "grandrounds.api",
    "FeedbackResult": "grandrounds.api",
    "MemoryChange": "grandrounds.api",
    "CaseOpen": "grandrounds.api",
    "UnknownCase": "grandrounds.api",
    "MemoryHub": "grandrounds.api",
    "NamespaceConfig": "grandrounds.api",
    "AgentReply": "grandrounds.handlers.backbones.agent",
    "AgentMemory": "grandrounds.handlers.backbones.agent",
    "RecalledItem": "grandrounds.handlers.backbones.agent",
    "Session": "grandrounds.streams.session",
}
__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from grandrounds.api import (AsyncMemory, CaseInput, CaseOpen, FeedbackResult, Memory, MemoryChange, MemoryHub,
                                 NamespaceConfig, Recall, Recorded, UnknownCase)
    from grandrounds.handlers.backbones.agent import AgentMemory, AgentReply, RecalledItem
    from grandrounds.streams.session import Session


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'grandrounds' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
