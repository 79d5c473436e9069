"""The one side effect of hooks: an HTTP POST. Tests point it at real local receivers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import httpx


@dataclass(frozen=True, slots=True)
class PostResult:
    status: int  # 0 when no HTTP answer came back (connection refused, timeout, TLS error)
    retry_after: float | None = None  # seconds, from a 429/503 ``Retry-After``
    error: str = ""


class Poster(Protocol):
    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout_seconds: float) -> PostResult: ...


class HttpxPoster:
    """httpx, one connection pool per hook; every transport error becomes ``status=0``."""

    def __init__(self, verify_tls: bool = True) -> None:
        self._client = httpx.AsyncClient(verify=verify_tls, follow_redirects=False)

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout_seconds: float) -> PostResult:
        try:
            resp = await self._client.post(url, content=body, headers=dict(headers), timeout=timeout_seconds)
        except httpx.HTTPError as exc:
            return PostResult(0, error=f"{type(exc).__name__}: {exc}"[:300])
        return PostResult(resp.status_code, _retry_after(resp.headers.get("retry-after")), resp.text[:300])

    async def aclose(self) -> None:
        await self._client.aclose()


def _retry_after(value: str | None) -> float | None:
    # Only the delta-seconds form; an HTTP-date falls back to our own backoff.
    if value is None or not value.strip().isdigit():
        return None
    return float(value.strip())


PosterFactory = Callable[[bool], Poster]


def default_poster(verify_tls: bool) -> Poster:
    return HttpxPoster(verify_tls)
