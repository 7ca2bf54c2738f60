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
    actions: dict | None = None
    """How agent turns are decoded and the json_schema probe's verdict; goes into the run spec."""
    requested_actions: str | None = None
    """`--actions` as asked (auto|schema|text), settled by `settle_actions` after the preflight."""


def choose_backbone(backbone: str | None, model: str | None, base_url: str | None,
                    record_from: str | None, live_fallthrough: bool, max_steps: int,
                    summary_every: int = 10, actions: str = "auto", timeout: float = 60.0) -> BackboneChoice:
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
        from grandrounds.handlers.backbones.registry import BACKBONE_REGISTRY

        # A backbone registered by an entry point (handlers/backbones/registry.py) is built by its own
        # factory from the model name alone; `agent` is chosen by --agent (grandrounds/agent_ref.py).
        if backbone in BACKBONE_REGISTRY and backbone not in BACKBONE_REGISTRY.builtin_names():
            return BackboneChoice(backbone, model, note)
        extra = [n for n in BACKBONE_REGISTRY.names() if n not in BACKBONE_REGISTRY.builtin_names()]
        available = ", ".join(["sim", "openai", "record", *extra])
        raise BackboneUnavailable(f"unknown backbone {backbone!r} (available: {available})")
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
    return BackboneChoice("openai", model, note, opts, agent=agent, requested_actions=actions)


def settle_actions(choice: BackboneChoice, base_url: str | None, timeout: float) -> dict[str, str] | None:
    """The run's action decoding for a live openai run (after the preflight): `choose_actions` on what
    was asked; None for sim and record runs (a record run takes the recorded run's)."""
    requested = choice.requested_actions
    if choice.name != "openai" or choice.record_from or requested is None:
        return choice.actions
    choice.actions = choose_actions(requested, choice.model, base_url, timeout)
    return choice.actions


def resumed_actions(db_path: str, run_id: str | None) -> tuple[bool, dict[str, str] | None]:
    """Whether run `run_id` already exists in `db_path`, and the action decoding it recorded (None: it
    predates the field, or ran the text protocol): a resumed run keeps it, un-probed."""
    if not run_id or not os.path.exists(db_path):
        return False, None
    from grandrounds.handlers.runs import read_spec
    from grandrounds.store.eventstore import EventStore

    import duckdb

    from grandrounds.store.eventstore import StoreError

    try:
        with EventStore(db_path, read_only=True) as store:
            spec = read_spec(store, run_id) if store.has_run(run_id) else None
    except (StoreError, duckdb.Error):
        return False, None  # not readable now: the run's own open says why, with its exit code
    if spec is None:
        return False, None
    return True, dict(spec.actions) if spec.actions else None


def choose_actions(requested: str, model: str, base_url: str | None, timeout: float) -> dict[str, str]:
    """`auto`: probe once whether the server enforces json_schema; schema-decoded turns if it does,
    the text protocol otherwise. `schema` insists (a server that rejects json_schema is an error);
    `text` does not probe."""
    if requested == "text":
        return {"mode": "text", "json_schema": "not-probed"}
    import asyncio

    from grandrounds.handlers.agent.actions import probe_json_schema
    from grandrounds.handlers.backbones.build import live_transport

    async def probe() -> str:
        transport = live_transport(base_url, None, timeout)
        try:
            return await probe_json_schema(transport, model)
        finally:
            await transport.aclose()

    verdict = asyncio.run(probe())
    if requested == "schema" and verdict in ("rejected", "unreachable"):
        raise BackboneUnavailable(f"--actions schema: the server's json_schema probe came back {verdict}")
    mode = "schema" if requested == "schema" or verdict == "enforced" else "text"
    return {"mode": mode, "json_schema": verdict}


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
    choice.actions = dict(spec.actions) if spec.actions else None  # and its action decoding, never re-probed
    choice.options["recorded"] = RecordedExchanges.from_store(source_store, choice.record_from)
