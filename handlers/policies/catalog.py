"""Registers every policy's event types and memory fold with the store.

The store decodes a log through registries (store/events.py, store/policy_memory.py) that the
policies fill, so the store never imports the layer above it. This module is imported with
`grandrounds.handlers`, so any reader above the store can decode the log of any policy. Each policy's
events and fold are light modules (pydantic models, a dataclass fold); its mechanism, prompts and
backbone code stay lazily loaded (registry.py).
"""

from grandrounds.handlers.policies.evo_medagent import events as _evo_events  # noqa: F401
from grandrounds.handlers.policies.evo_medagent import memory as _evo_memory  # noqa: F401  (also precedent, none)
from grandrounds.handlers.policies.long_context import memory as _long_context_memory  # noqa: F401
from grandrounds.handlers.policies.retrosum import events as _retrosum_events  # noqa: F401
from grandrounds.handlers.policies.retrosum import memory as _retrosum_memory  # noqa: F401
from grandrounds.handlers.policies.selsm import events as _selsm_events  # noqa: F401
from grandrounds.handlers.policies.selsm import memory as _selsm_memory  # noqa: F401
from grandrounds.handlers.policies.skemex import events as _skemex_events  # noqa: F401
from grandrounds.handlers.policies.skemex import memory as _skemex_memory  # noqa: F401
