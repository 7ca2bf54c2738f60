"""Backbones: what acts and reflects. `sim` is offline and deterministic (tests, demos, benchmarks);
`openai` calls any OpenAI-compatible endpoint; `record` serves a recorded run's exchanges; `agent` asks a
user's own agent, its replies recorded as exchanges. Others register through the `grandrounds.backbones`
entry points (handlers/backbones/registry.py)."""

from __future__ import annotations

from grandrounds.handlers.backbones.registry import RecordedBackbones, known_backbones, registration
from grandrounds.store.errors import InvalidInput

BACKBONES = ("sim", "openai", "record", "agent")
"""The built-in backbones (`known_backbones()`: with those registered by entry points)."""
RECORDED_BACKBONES = RecordedBackbones()
"""Backbones whose replies are recorded exchanges: verify and replay serve them from the record
(read from each registration's `recorded`)."""


class BackboneUnavailable(InvalidInput, ValueError):
    pass


def make_backbone(name: str, model: str | None = None, **options):
    """Options for openai/record: base_url, api_key (default: $OPENAI_API_KEY), timeout, retry
    (RetryPolicy), params, max_steps, summary_every (RetroSum window w; 0 = off), structured
    ('auto'|'schema'|'prompt'), recorded (RecordedExchanges: serve those instead of calling the
    model), live_fallthrough (bool).
    The sim backbone takes none and ignores them. agent: agent (the user's callable), recorded,
    live_fallthrough (handlers/backbones/agent.py). A registered backbone: its factory's."""
    try:
        found = registration(name)
    except KeyError:
        raise BackboneUnavailable(f"unknown backbone {name!r} (available: {', '.join(known_backbones())})") from None
    return found.build(name, model, **options)
