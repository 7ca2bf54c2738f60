"""Backbones: what acts and reflects. `sim` is offline and deterministic (tests, demos, benchmarks);
`openai` calls any OpenAI-compatible endpoint; `record` serves a recorded run's exchanges."""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput

BACKBONES = ("sim", "openai", "record")


class BackboneUnavailable(InvalidInput, ValueError):
    pass


def make_backbone(name: str, model: str | None = None, **options):
    """Options for openai/record: base_url, api_key (default: $OPENAI_API_KEY), timeout, retry
    (RetryPolicy), params, max_steps, summary_every (RetroSum window w; 0 = off), structured
    ('auto'|'schema'|'prompt'), recorded (RecordedExchanges: serve those instead of calling the
    model), live_fallthrough (bool).
    The sim backbone takes none and ignores them."""
    if name == "sim":
        from grandrounds.handlers.backbones.sim import SimBackbone

        return SimBackbone()
    if name in ("openai", "record"):
        from grandrounds.handlers.backbones.build import build_model_backbone

        return build_model_backbone(name, model, **options)
    raise BackboneUnavailable(f"unknown backbone {name!r} (available: {', '.join(BACKBONES)})")
