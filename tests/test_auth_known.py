"""The caller known without a database read (``Authenticator.known``), and the route dependencies
that need no worker thread (``fabricd/server/deps.py``)."""

from __future__ import annotations

import inspect

import pytest

from fabricd.server import deps
from fabricd.server.auth import ANONYMOUS, Authenticator
from fabricd.server.errors import ApiError
from fabricd.server.store.records import TokenInfo

LIVE = TokenInfo(7, "agent", "node-a", "rack 3", 0.0, None)


class Tokens:
    """The token table: ``find`` counts its reads."""

    def __init__(self) -> None:
        self.reads = 0

    def find(self, token: str) -> TokenInfo | None:
        self.reads += 1
        return LIVE if token == "good" else None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_auth_off_is_anonymous_without_a_read() -> None:
    tokens = Tokens()
    assert Authenticator(tokens, enabled=False, cache_seconds=60).known(None) is ANONYMOUS
    assert tokens.reads == 0


def test_a_cached_token_is_known_until_its_cache_entry_expires() -> None:
    tokens, clock = Tokens(), Clock()
    auth = Authenticator(tokens, enabled=True, cache_seconds=60, clock=clock)
    assert auth.known("good") is None  # never read: the caller must authenticate off the loop
    first = auth.authenticate("good")
    assert (first.role, first.node, tokens.reads) == ("agent", "node-a", 1)
    assert auth.known("good") == first and tokens.reads == 1
    clock.now += 60  # the entry expired: a revoked token must be read again
    assert auth.known("good") is None
    assert auth.authenticate("good") == first and tokens.reads == 2


def test_missing_and_refused_tokens_are_never_known() -> None:
    tokens = Tokens()
    auth = Authenticator(tokens, enabled=True, cache_seconds=60)
    assert auth.known(None) is None and auth.known("") is None
    with pytest.raises(ApiError) as refused:  # the refusal is cached ...
        auth.authenticate("bad")
    assert (refused.value.status, tokens.reads) == (401, 1)
    assert auth.known("bad") is None  # ... but only authenticate answers it, with its 401


def test_the_route_dependencies_run_on_the_event_loop() -> None:
    # FastAPI runs a plain ``def`` dependency in its thread pool: a worker-thread hop per
    # dependency per request. Every provider of deps.py only looks up attributes (the caller reads
    # the token table off the loop itself, on a cache miss).
    providers = [
        f
        for name, f in vars(deps).items()
        if inspect.isfunction(f) and f.__module__ == deps.__name__ and name != "when"
    ]
    assert len(providers) >= 16
    assert [f.__name__ for f in providers if not inspect.iscoroutinefunction(f)] == []


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer ", "Bearer abc", "bearer  abc ", "Basic abc", "Bearer a b", "BEARER x", " Bearer x"],
)
def test_the_ingest_route_reads_the_token_as_the_other_routes_do(header: str | None) -> None:
    """The ingest route reads its token itself (no dependency resolution per batch): the same token,
    or none, as FastAPI's ``HTTPBearer`` gives the other routes."""
    import asyncio

    from fastapi.security import HTTPBearer
    from starlette.requests import Request

    from fabricd.server.auth import bearer_token

    headers = [] if header is None else [(b"authorization", header.encode())]
    request = Request({"type": "http", "headers": headers})
    creds = asyncio.run(HTTPBearer(auto_error=False)(request))
    assert bearer_token(header) == (creds.credentials if creds else None)
