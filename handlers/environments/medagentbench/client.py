"""An async FHIR client that sends what the official MedAgentBench client sends.

The official harness GETs with `requests.get(url)` (`utils.send_get_request`): `requests` re-quotes
the URL before sending (`requote_uri`: characters outside the URL-safe set, spaces and non-ASCII
letters included, become %XX; an existing valid %XX stays), raises on 4xx/5xx and keeps the body
as text unless the content type is exactly `application/json`. `request_url` is that quoting, so a
URL the model wrote with a space reaches the server as the official client would send it (no
crash); `FhirClient.get` returns the status, the body text and what the official client would have
reported.
"""

from __future__ import annotations

from grandrounds.store.errors import Retryable
import re
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import quote

try:  # the HTTP client the `openai` package brings (httpx; httpx2 in newer releases)
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older openai releases depend on httpx
    import httpx  # type: ignore[no-redef]

_SAFE_WITH_PERCENT = "!#$%&'()*+,/:;=?@[]~"
_SAFE_WITHOUT_PERCENT = "!#$&'()*+,/:;=?@[]~"
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_PCT = re.compile(r"%([0-9A-Fa-f]{2})")


class FhirTransportError(Retryable, OSError):
    """The server could not be reached (or answered nothing usable)."""


def _unquote_unreserved(uri: str) -> str:
    """requests.utils.unquote_unreserved: %XX of an unreserved character becomes the character."""
    parts = uri.split("%")
    for i in range(1, len(parts)):
        h = parts[i][0:2]
        if len(h) == 2 and h.isalnum():
            try:
                c = chr(int(h, 16))
            except ValueError:
                raise ValueError(f"invalid percent-escape sequence: {h!r}") from None
            parts[i] = (c + parts[i][2:]) if c in _UNRESERVED else f"%{parts[i]}"
        else:
            parts[i] = f"%{parts[i]}"
    return "".join(parts)


def request_url(url: str) -> str:
    """The URL as `requests` sends it (`requote_uri`): unsafe characters percent-encoded (UTF-8)."""
    try:
        return quote(_unquote_unreserved(url), safe=_SAFE_WITH_PERCENT)
    except ValueError:  # a stray "%": quote it too, as requests does
        return quote(url, safe=_SAFE_WITHOUT_PERCENT)


@dataclass(frozen=True)
class FhirResponse:
    status: int
    text: str
    content_type: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 400

    def official_error(self, url: str) -> str:
        """The message of requests' `raise_for_status` for this status (what the harness shows)."""
        try:
            reason = HTTPStatus(self.status).phrase
        except ValueError:
            reason = ""
        kind = "Client" if self.status < 500 else "Server"
        return f"{self.status} {kind} Error: {reason} for url: {url}"


class FhirClient:
    """GET and POST over HTTP, one short-lived async connection per request (a FHIR task makes a
    handful; no pool outlives the event loop that made it)."""

    def __init__(self, timeout: float = 30.0):
        self.timeout = timeout

    async def get(self, url: str) -> FhirResponse:
        sent = request_url(url)
        # TLS settings only matter for https (building a verifying context costs ~0.15 s per client)
        try:
            async with httpx.AsyncClient(timeout=self.timeout, trust_env=False,
                                         verify=sent.startswith("https:")) as c:
                r = await c.get(sent)
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
            raise FhirTransportError(str(exc) or type(exc).__name__) from None
        return FhirResponse(r.status_code, r.text, r.headers.get("content-type", ""))

    async def get_json(self, url: str) -> dict:
        r = await self.get(url)
        if not r.ok:
            raise FhirTransportError(r.official_error(url))
        import json

        return json.loads(r.text)
