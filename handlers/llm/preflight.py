"""One cheap request before the first case: is the endpoint there, is the key accepted, is the model served?

Run by the commands before they open or write anything, so a wrong `--base-url`, a missing key or a
misspelt model costs seconds and leaves no run behind (exit 1), instead of failing every case. It asks
`GET {base}/models` (no tokens spent); a server without that route (404/405/501) gets a one-token chat
completion instead. Everything is bounded by one deadline (`PREFLIGHT_TIMEOUT_S`).
"""

from __future__ import annotations

import json
import time

from grandrounds.handlers.llm.errors import ModelOutage
from grandrounds.handlers.llm.transport import _scrub

PREFLIGHT_TIMEOUT_S = 25.0


def preflight(base_url: str | None, api_key: str, model: str, timeout: float = PREFLIGHT_TIMEOUT_S) -> str:
    """Returns how the model was confirmed; raises `ModelOutage` (stage `preflight`) saying what is wrong."""
    import openai

    deadline = time.monotonic() + timeout
    client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0)
    endpoint = str(client.base_url).rstrip("/")

    def outage(kind: str, message: str) -> ModelOutage:
        return ModelOutage(kind, _scrub(message, api_key)[:500], endpoint, 1, stage="preflight")

    def left() -> float:
        return max(deadline - time.monotonic(), 1.0)

    try:
        try:
            raw = client.models.with_raw_response.list(timeout=left())
            listed = _model_ids(raw.http_response.content)
            if listed is None:
                raise outage("malformed", f"GET {endpoint}/models did not return a model list: "
                                          f"{raw.http_response.content[:200]!r}")
            if model in listed or f"{model}:latest" in listed:
                return "listed"
            raise outage("model", f"model {model!r} is not served here (it serves: {', '.join(listed[:20]) or 'none'})")
        except openai.APIStatusError as exc:
            if exc.status_code not in (404, 405, 501):
                raise
        # No model list on this server: one token of chat, which also proves the model name.
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "ping"}], max_tokens=1, temperature=0.0,
            timeout=left())
        data = _json(raw.http_response.content)
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise outage("malformed", f"a one-token chat completion did not return one: "
                                      f"{raw.http_response.content[:200]!r}")
        return "chat"
    except openai.APITimeoutError:
        raise outage("timeout", f"no answer within {timeout:.0f} s") from None
    except openai.APIConnectionError as exc:
        raise outage("connection", f"cannot connect ({exc.__cause__ or exc})") from None
    except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
        raise outage("auth", f"the API key was refused (OPENAI_API_KEY): {exc}") from None
    except (openai.NotFoundError, openai.BadRequestError) as exc:
        raise outage("model", f"model {model!r} refused: {exc}") from None
    except openai.APIStatusError as exc:
        raise outage("server", str(exc)) from None
    except openai.OpenAIError as exc:
        raise outage("malformed", str(exc)) from None
    finally:
        client.close()


def _json(body: bytes):
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def _model_ids(body: bytes) -> list[str] | None:
    data = _json(body)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return None
    return [str(m.get("id")) for m in data["data"] if isinstance(m, dict) and m.get("id") is not None]
