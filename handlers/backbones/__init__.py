"""Backbones: what acts and reflects. `sim` is offline and deterministic (tests, demos, benchmarks)."""

from __future__ import annotations

BACKBONES = ("sim",)


class BackboneUnavailable(ValueError):
    pass


def make_backbone(name: str, model: str | None = None, **options):
    if name == "sim":
        from handlers.backbones.sim import SimBackbone

        return SimBackbone()
    raise BackboneUnavailable(f"unknown backbone {name!r} (available: {', '.join(BACKBONES)})")
