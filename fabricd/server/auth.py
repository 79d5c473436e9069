"""Bearer tokens: roles agent | read | admin, optional node binding, looked up per request.

Tokens are random (``new_token``: 256 bits from ``secrets``) and stored as sha256 digests
(``token_digest``; ``store/tokens.py`` keeps them); a revoked or rotated token stops working within
``token_cache_seconds`` without a restart. ``admin`` can do everything ``read`` can and may ingest
for any node; ``agent`` may only ingest, and only for its bound node when it has one.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fabricd.server.errors import ApiError
from fabricd.server.store.protocols import TokenLookup
from fabricd.server.store.records import TokenInfo

WWW_AUTH = {"WWW-Authenticate": "Bearer"}
ROLES = ("agent", "read", "admin")
TOKEN_PREFIX = "fabricd_"  # tells a leaked token apart in logs and secret scanners


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """What is stored of a token. A plain sha256 is enough: the token has 256 random bits, so
    nothing is gained by a slow password hash, and a lookup per request stays cheap."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    role: str  # agent | read | admin
    node: str | None
    name: str  # "token:<id>" (recorded as who acked) or "anonymous" with auth disabled

    def can_read(self) -> bool:
        return self.role in ("read", "admin")


ANONYMOUS = Principal("admin", None, "anonymous")


class Authenticator:
    def __init__(
        self, tokens: TokenLookup, enabled: bool, cache_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.tokens, self.enabled, self.cache_seconds, self.clock = tokens, enabled, cache_seconds, clock
        self._cache: dict[str, tuple[float, TokenInfo | None]] = {}
        self._lock = threading.Lock()

    def known(self, token: str | None) -> Principal | None:
        """The caller when it is known without a database read (auth off, or a valid token in the
        cache), else None: then ``authenticate`` decides, off the event loop."""
        if not self.enabled:
            return ANONYMOUS
        hit = self._fresh(token) if token else None
        return self._principal(hit[1]) if hit is not None and hit[1] is not None else None

    def authenticate(self, token: str | None) -> Principal:
        if not self.enabled:
            return ANONYMOUS
        if not token:
            raise ApiError(
                401,
                "unauthorized",
                "missing bearer token: send 'Authorization: Bearer <token>' (create one with `fabricd token create`)",
                WWW_AUTH,
            )
        info = self._lookup(token)
        if info is None:
            raise ApiError(401, "unauthorized", "unknown or revoked token", WWW_AUTH)
        return self._principal(info)

    @staticmethod
    def _principal(info: TokenInfo) -> Principal:
        return Principal(info.role, info.node, f"token:{info.id}" + (f" ({info.note})" if info.note else ""))

    def _fresh(self, token: str) -> tuple[float, TokenInfo | None] | None:
        """The token's cache entry while it lives (its record, or None for a refused token)."""
        with self._lock:
            hit = self._cache.get(token)
        return hit if hit is not None and hit[0] > self.clock() else None

    def _lookup(self, token: str) -> TokenInfo | None:
        if (hit := self._fresh(token)) is not None:
            return hit[1]
        now = self.clock()
        info = self.tokens.find(token)
        with self._lock:
            if len(self._cache) > 10_000:  # wrong tokens must not grow this without bound
                self._cache.clear()
            self._cache[token] = (now + self.cache_seconds, info)
        return info


def require_read(p: Principal) -> Principal:
    if not p.can_read():
        raise ApiError(403, "forbidden", f"this endpoint needs a read or admin token; this one has role {p.role!r}")
    return p


def require_admin(p: Principal) -> Principal:
    if p.role != "admin":
        raise ApiError(403, "forbidden", f"this endpoint needs an admin token; this one has role {p.role!r}")
    return p


def require_ingest_role(p: Principal) -> None:
    if p.role not in ("agent", "admin"):
        raise ApiError(403, "forbidden", f"ingest needs an agent or admin token; this one has role {p.role!r}")


def require_node(p: Principal, node: str) -> None:
    if p.node is not None and p.node != node:
        raise ApiError(403, "forbidden", f"this token is bound to node {p.node!r} and cannot send for {node!r}")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, as FastAPI's ``HTTPBearer`` reads
    it for the routes' ``Caller`` (None when absent or of another scheme)."""
    scheme, _, credentials = (authorization or "").partition(" ")
    credentials = credentials.strip()
    return credentials if credentials and scheme.lower() == "bearer" else None
