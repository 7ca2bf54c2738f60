"""Choosing and configuring the backbone for `grandrounds run` (kept out of cli.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from grandrounds.handlers.backbones import BackboneUnavailable


@dataclass
class BackboneChoice:
    name: str
    """What goes into the run spec: `sim` or `openai` (a record run re-executes an openai run)."""
    model: str | None
    note: str = ""
    options: dict = field(default_factory=dict)
    record_from: str | None = None
    agent: dict = field(default_factory=dict)
    """Agent-loop settings that differ from the defaults; they go into the run spec."""


def choose_backbone(backbone: str | None, model: str | None, base_url: str | None,
                    record_from: str | None, live_fallthrough: bool, max_steps: int,
                    summary_every: int = 10) -> BackboneChoice:
    """The default is openai only when an endpoint is configured (--base-url or OPENAI_BASE_URL)."""
    endpoint = base_url or os.environ.get("OPENAI_BASE_URL")
    note = ""
    if backbone is None:
        if endpoint:
            backbone = "openai"
            note = f"model endpoint {endpoint} configured: using the openai backbone (--backbone sim for the simulator)"
        else:
            backbone = "sim"
            note = "no model endpoint configured (--base-url / OPENAI_BASE_URL): using the offline sim backbone"
    if backbone == "sim":
        return BackboneChoice("sim", model, note)
    if backbone not in ("openai", "record"):
        raise BackboneUnavailable(f"unknown backbone {backbone!r} (available: sim, openai, record)")
    opts = {"base_url": base_url}
    agent = {k: v for k, v, default in (("max_steps", max_steps, 7), ("summary_every", summary_every, 10))
             if v != default}
    if backbone == "record":
        if not record_from:
            raise BackboneUnavailable("--backbone record needs --record-from RUN (the run whose exchanges to serve)")
        opts["live_fallthrough"] = live_fallthrough
        return BackboneChoice("openai", model, note, opts, record_from, agent)
    if not model:
        raise BackboneUnavailable("the openai backbone needs --model")
    return BackboneChoice("openai", model, note, opts, agent=agent)


def attach_record(choice: BackboneChoice, source_store) -> None:
    """Load the recorded run's exchanges into the choice; the model is the recorded run's."""
    from grandrounds.handlers.llm.record import RecordedExchanges
    from grandrounds.handlers.runs import read_spec

    spec = read_spec(source_store, choice.record_from) if source_store.has_run(choice.record_from) else None
    if spec is None:
        raise BackboneUnavailable(f"--record-from: no run {choice.record_from!r} in the record database")
    if spec.backbone != "openai":
        raise BackboneUnavailable(f"run {choice.record_from!r} used the {spec.backbone} backbone: nothing to serve")
    if choice.model and choice.model != spec.model:
        raise BackboneUnavailable(f"--model {choice.model} differs from the recorded run's model {spec.model}")
    choice.model = spec.model
    choice.agent = dict(spec.agent)  # re-execute with the recorded run's agent bounds
    choice.options["recorded"] = RecordedExchanges.from_store(source_store, choice.record_from)
