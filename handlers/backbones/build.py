"""Building the `openai` / `record` backbone: endpoint, key, transport, gateway, agent settings."""

from __future__ import annotations

import os
from typing import Any

from grandrounds.handlers.agent.react import AgentConfig
from grandrounds.handlers.backbones import BackboneUnavailable
from grandrounds.handlers.backbones.openai_backbone import OpenAIBackbone
from grandrounds.handlers.llm.gateway import DEFAULT_TIMEOUT_S, LLMGateway, RetryPolicy
from grandrounds.handlers.llm.record import RecordedExchanges, RecordedTransport
from grandrounds.handlers.llm.transport import OpenAITransport

OPENAI_NOTE = "openai backbone: model {model} at {where}"
RECORD_NOTE = "record backend: model {model}'s exchanges served from run {run}{live} — no live model calls"


def endpoint_and_key(base_url: str | None, api_key: str | None) -> tuple[str | None, str]:
    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
    key = api_key or os.environ.get("OPENAI_API_KEY")
    if not key:
        if base_url is None:
            raise BackboneUnavailable("the openai backbone needs OPENAI_API_KEY (or --base-url for a local server)")
        key = "not-needed"  # vLLM, Ollama and LM Studio accept any key
    return base_url, key


def live_transport(base_url: str | None, api_key: str | None, timeout: float) -> OpenAITransport:
    return OpenAITransport(*endpoint_and_key(base_url, api_key), timeout)


def build_model_backbone(name: str, model: str | None, *, base_url: str | None = None, api_key: str | None = None,
                         timeout: float = DEFAULT_TIMEOUT_S, retry: RetryPolicy | None = None,
                         params: dict[str, Any] | None = None, max_steps: int = 7, summary_every: int = 10,
                         structured: str = "auto", actions: str = "text",
                         recorded: RecordedExchanges | None = None, live_fallthrough: bool = False,
                         **_ignored: Any) -> OpenAIBackbone:
    if not model:
        raise BackboneUnavailable(f"the {name} backbone needs --model")
    if name == "record" and recorded is None:
        raise BackboneUnavailable("the record backend needs a recorded run to serve (--record-from RUN)")
    if recorded is not None:
        live = live_transport(base_url, api_key, timeout) if live_fallthrough else None
        transport = RecordedTransport(recorded, live)
        note = RECORD_NOTE.format(model=model, run=recorded.source_run,
                                  live=" (live fall-through on a miss)" if live_fallthrough else "")
    else:
        transport = live_transport(base_url, api_key, timeout)
        where = base_url or os.environ.get("OPENAI_BASE_URL") or "api.openai.com"
        note = OPENAI_NOTE.format(model=model, where=where)
    gateway = LLMGateway(transport, model, params=dict(params) if params else {"temperature": 0.0},
                         retry=retry or RetryPolicy())
    agent = AgentConfig(max_steps=max_steps, summary_every=summary_every, actions=actions)
    return OpenAIBackbone(gateway, note, agent, structured)  # type: ignore[arg-type]
