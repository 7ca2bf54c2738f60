"""Event store (DuckDB), event types and upcasters, projections, embeddings and snapshots.

What every policy shares lives here; a policy's own events and memory fold live in its package under
handlers/policies/ and register themselves (store/events.py `event`, store/policy_memory.py
`register_part`), so the store never imports a layer above it. The store's own event types are
registered here, with the package, so every reader of a log can decode them.
"""

from grandrounds.store import event_types as _event_types  # noqa: F401  (run, case, memory, rule ...)
from grandrounds.store import llm_events as _llm_events  # noqa: F401  (llm.exchange, case.failed)
