"""Backbones: what acts and reflects. `sim` is offline and deterministic (tests, demos, benchmarks);
`openai` calls any OpenAI-compatible endpoint; `record` serves a recorded run's exchanges; `agent` asks a
user's own agent, its replies recorded as exchanges."""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput

BACKBONES = ("sim", "openai", "record", "agent")
RECORDED_BACKBONES = ("openai", "record", "agent")
"""Backbones whose replies are recorded exchanges: verify and replay serve them from the record."""


class BackboneUnavailable(InvalidInput, ValueError):
    pass


def make_backbone(name: str, model: str | None = None, **options):
    """Options for openai/record: base_url, api_key (default: $OPENAI_API_KEY), timeout, retry
    (RetryPolicy), params, max_steps, summary_every (RetroSum window w; 0 = off), structured
    ('auto'|'schema'|'prompt'), recorded (RecordedExchanges: serve those instead of calling the
    model), live_fallthrough (bool).
    The sim backbone takes none and ignores them. agent: agent (the user's callable), recorded,
    live_fallthrough (handlers/backbones/agent.py)."""
    if name == "sim":
        from grandrounds.handlers.backbones.sim import SimBackbone

        return SimBackbone()
    if name in ("openai", "record"):
        from grandrounds.handlers.backbones.build import build_model_backbone

        return build_model_backbone(name, model, **options)
    if name == "agent":
        from grandrounds.handlers.backbones.agent import build_agent_backbone

        return build_agent_backbone(model, **options)
    raise BackboneUnavailable(f"unknown backbone {name!r} (available: {', '.join(BACKBONES)})")
