"""Send one encoded batch to the central service and say what to do next.

The HTTP call sits behind a one-method seam (``Poster.post``) so the decision logic -- which answers
are success, which are worth retrying, which are permanent for this batch -- is tested against a
real local server and stays independent of the HTTP library.

    200/201/202                  -> SENT (``duplicate: true`` also: the central already has it)
    429, 503 (+ Retry-After)     -> RETRY after the server's delay (load shedding)
    408, other 5xx, conn errors  -> RETRY with backoff (the central is down or restarting)
    4xx unsupported_schema_version -> RETRY with backoff: the central reads other wire versions
                                    (a rolling upgrade); the batch waits in the spool, never dropped
    other 4xx (400/401/413/...)  -> PERMANENT: retrying the same bytes cannot succeed
"""

from __future__ import annotations

import enum
import json
import random
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import httpx

from fabricd.settings import TransportSettings

INGEST_PATH = "/api/v1/ingest"
# The error code a central answers for a wire version it does not read (fabricd/server/ingest.py).
UNSUPPORTED_VERSION = "unsupported_schema_version"
# A misconfigured server must not park the agent for hours: Retry-After is honoured up to this.
MAX_RETRY_AFTER_SECONDS = 300.0


class PostError(Exception):
    """The request got no HTTP answer (refused, reset, timeout, TLS failure); the text says why."""


@dataclass(frozen=True, slots=True)
class PostResult:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    text: str = ""


class Poster(Protocol):
    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> PostResult: ...


class HttpxPoster:
    """The real poster: one pooled ``httpx.AsyncClient``, TLS verified (custom CA allowed)."""

    def __init__(self, settings: TransportSettings) -> None:
        self._client = httpx.AsyncClient(
            timeout=settings.timeout_seconds,
            verify=tls_verify(settings),
            limits=httpx.Limits(keepalive_expiry=settings.keepalive_seconds),
        )

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> PostResult:
        try:
            resp = await self._client.post(url, content=body, headers=dict(headers))
        except httpx.TimeoutException as exc:
            raise PostError(f"timed out: {type(exc).__name__}") from exc
        except httpx.TransportError as exc:
            raise PostError(describe_transport_error(exc)) from exc
        return PostResult(resp.status_code, dict(resp.headers), resp.text[:2000])

    async def aclose(self) -> None:
        await self._client.aclose()


def tls_verify(settings: TransportSettings) -> ssl.SSLContext | bool:
    if not settings.verify_tls:
        return False
    if settings.ca_file is not None:
        return ssl.create_default_context(cafile=str(settings.ca_file))
    return True


def describe_transport_error(exc: BaseException) -> str:
    # httpx wraps the ssl error; its text ("certificate verify failed: self-signed certificate")
    # is what an operator needs, so walk the cause chain for the most specific message.
    text = str(exc) or type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return f"TLS error: {cause}"
        cause = cause.__cause__ or cause.__context__
    return f"{type(exc).__name__}: {text}"


def default_poster_factory(settings: TransportSettings) -> Poster:
    return HttpxPoster(settings)


class Outcome(enum.Enum):
    SENT = "sent"
    RETRY = "retry"
    PERMANENT = "permanent"


@dataclass(frozen=True, slots=True)
class SendResult:
    outcome: Outcome
    reason: str = ""
    retry_after: float | None = None  # seconds, from the server's Retry-After
    duplicate: bool = False
    status: int = 0
    # The central does not read this batch's wire version; these are the versions it reads.
    unsupported_version: bool = False
    supported_versions: tuple[int, ...] = ()


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP-date (RFC 9110 section 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


def classify(result: PostResult, now: float) -> SendResult:
    status = result.status
    if 200 <= status < 300:
        return SendResult(Outcome.SENT, duplicate=_duplicate(result.text), status=status)
    reason = f"HTTP {status}: {_server_message(result.text)}"
    if status in (429, 503):
        after = parse_retry_after(_header(result.headers, "retry-after"), now)
        return SendResult(Outcome.RETRY, reason, retry_after=after, status=status)
    if status == 408 or status >= 500:
        return SendResult(Outcome.RETRY, reason, status=status)
    body = _json_object(result.text)
    if body.get("error") == UNSUPPORTED_VERSION:
        versions = tuple(v for v in body.get("supported_versions", ()) if isinstance(v, int))
        return SendResult(Outcome.RETRY, reason, status=status, unsupported_version=True, supported_versions=versions)
    return SendResult(Outcome.PERMANENT, reason, status=status)


def _json_object(text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def _duplicate(text: str) -> bool:
    try:
        return bool(json.loads(text).get("duplicate", False))
    except (ValueError, AttributeError):
        return False


def _server_message(text: str) -> str:
    """The central answers ``{"error": code, "message": ...}``; plain FastAPI ``{"detail": ...}``;
    fall back to the raw text. Kept short for logs."""
    try:
        obj = json.loads(text)
        detail = obj.get("message") or obj.get("detail") or text
        if obj.get("error") and isinstance(detail, str):
            detail = f"{obj['error']}: {detail}"
    except (ValueError, AttributeError):
        detail = text
    return (detail if isinstance(detail, str) else json.dumps(detail))[:500]


class Backoff:
    """Exponential backoff with full jitter: sleep ~ U(0, min(cap, base * 2**n)).

    Full jitter spreads a fleet of agents that lost the central at the same instant, so they do
    not reconnect in lockstep (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015).
    """

    def __init__(self, initial: float, maximum: float, rng: random.Random | None = None) -> None:
        self.initial = initial
        self.maximum = maximum
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * 2.0 ** min(self.attempt, 62))
        self.attempt += 1
        return self._rng.uniform(0.0, ceiling)

    def reset(self) -> None:
        self.attempt = 0


class Sender:
    def __init__(
        self,
        settings: TransportSettings,
        central: str,
        token: str,
        agent_version: str,
        poster: Poster,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = central.rstrip("/") + INGEST_PATH
        self.poster = poster
        self._wall_clock = wall_clock
        self._base_headers = {"User-Agent": f"fabricd-agent/{agent_version}"}
        if token:
            self._base_headers["Authorization"] = f"Bearer {token}"

    def headers(self, batch_id: str, content_type: str, gzipped: bool) -> dict[str, str]:
        out = dict(self._base_headers, **{"Content-Type": content_type, "X-Fabricd-Batch-Id": batch_id})
        if gzipped:
            out["Content-Encoding"] = "gzip"
        return out

    async def send(self, batch_id: str, body: bytes, content_type: str, gzipped: bool) -> SendResult:
        try:
            result = await self.poster.post(self.url, body, self.headers(batch_id, content_type, gzipped))
        except PostError as exc:
            return SendResult(Outcome.RETRY, str(exc))
        return classify(result, self._wall_clock())
