"""``POST /api/v1/ingest`` skips FastAPI's router (``routes.ingest.IngestShortcut``): every answer,
refusals and a failure included, is the one the routed handler gives.

Two services on two fresh databases take the same requests in the same order, one the way agents
reach it and one under a root path, which the shortcut leaves to the router; the handler records
which way each request came (the router puts the matched endpoint in the scope).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest

from fabricd import wire
from fabricd.server import app as app_module
from fabricd.server.routes import ingest as ingest_route
from fabricd.settings import LimitSettings, ServerSettings
from tests.support.server import encoded, ib_sample, make_batch

ROOT = "/fabricd"  # a root path: the shortcut leaves the request to the router


@asynccontextmanager
async def _service(tmp_path: Path, root_path: str) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    settings = ServerSettings(
        db=f"sqlite:///{tmp_path / 'fabricd.db'}",
        data_dir=tmp_path / "data",
        token_cache_seconds=0,
        limits=LimitSettings(max_body_bytes=64 * 1024),
    )
    app = app_module.create_app(settings)
    async with app.router.lifespan_context(app):
        tokens = app.state.services.store.tokens
        now = time.time()
        keys = {
            "agent": tokens.create("agent", now, node="node-a")[1],
            "other": tokens.create("agent", now, node="node-b")[1],
            "read": tokens.create("read", now)[1],
        }
        # A failure must reach the service's error middleware, as a real server's would: not
        # raised into the test.
        transport = httpx.ASGITransport(app=app, root_path=root_path, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://fabricd.test") as client:
            client.app = app  # type: ignore[attr-defined]
            yield client, keys


def _batch(batch_id: str) -> tuple[bytes, dict[str, str]]:
    ts = 1_800_000_000.0
    return encoded(make_batch("node-a", batch_id, [ib_sample(ts, device=f"mlx5_{i}") for i in range(3)], ts))


def _requests(keys: dict[str, str]) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, method, httpx arguments) of each request, in order."""

    def auth(name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {keys[name]}"}

    body, headers = _batch("b1")
    plain = wire.encode(make_batch("node-a", "b2", [ib_sample(1_800_000_000.0)]), wire.JSON, compress=False)
    many = [ib_sample(float(i), device=f"mlx5_{i}") for i in range(1500)]  # a string each: over 64 KiB
    huge, huge_headers = encoded(make_batch("node-a", "b3", many), gzip=False)
    assert len(huge) > 64 * 1024
    return [
        ("stored", "POST", {"content": body, "headers": {**headers, **auth("agent")}}),
        ("duplicate", "POST", {"content": body, "headers": {**headers, **auth("agent")}}),
        ("json", "POST", {"content": plain, "headers": {"Content-Type": wire.JSON, **auth("agent")}}),
        ("no token", "POST", {"content": body, "headers": headers}),
        ("unknown token", "POST", {"content": body, "headers": {**headers, "Authorization": "Bearer nope"}}),
        ("other scheme", "POST", {"content": body, "headers": {**headers, "Authorization": f"Basic {keys['agent']}"}}),
        ("another node's token", "POST", {"content": body, "headers": {**headers, **auth("other")}}),
        ("read role", "POST", {"content": body, "headers": {**headers, **auth("read")}}),
        ("content type", "POST", {"content": body, "headers": {"Content-Type": "text/plain", **auth("agent")}}),
        ("bad gzip", "POST", {"content": b"\x1f\x8bnot gzip", "headers": {**headers, **auth("agent")}}),
        ("too large", "POST", {"content": huge, "headers": {**huge_headers, **auth("agent")}}),
        ("not a batch", "POST", {"content": b"[1, 2]", "headers": {"Content-Type": wire.JSON, **auth("agent")}}),
        ("get", "GET", {"headers": auth("agent")}),
    ]


def _answer(resp: httpx.Response) -> tuple[int, Any, dict[str, str]]:
    kept = {k: v for k, v in resp.headers.items() if k in ("content-type", "retry-after", "allow")}
    return resp.status_code, resp.json(), kept


async def _answers(
    tmp_path: Path, root_path: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, tuple[int, Any, dict[str, str]]], list[bool]]:
    routed: list[bool] = []
    respond = ingest_route.respond

    async def spy(svc: Any, request: Any) -> Any:
        routed.append("endpoint" in request.scope)
        return await respond(svc, request)

    monkeypatch.setattr(ingest_route, "respond", spy)
    out = {}
    async with _service(tmp_path, root_path) as (client, keys):
        for name, method, kw in _requests(keys):
            out[name] = _answer(await client.request(method, "/api/v1/ingest", **kw))
        svc = client.app.state.services  # type: ignore[attr-defined]

        def fail(*_a: object, **_k: object) -> NoReturn:
            raise RuntimeError("the store is gone")

        monkeypatch.setattr(svc.ingestor, "handle", fail)
        body, headers = _batch("b9")
        failed = await client.post(
            "/api/v1/ingest", content=body, headers={**headers, "Authorization": f"Bearer {keys['agent']}"}
        )
        out["failure"] = _answer(failed)
    monkeypatch.undo()
    return out, routed


async def test_the_shortcut_answers_every_request_as_the_router_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct, direct_routed = await _answers(tmp_path / "direct", "", monkeypatch)
    via_router, router_routed = await _answers(tmp_path / "routed", ROOT, monkeypatch)
    assert direct == via_router
    assert direct_routed and not any(direct_routed)  # every POST went the shortcut's way
    assert router_routed and all(router_routed)
    expected = {
        "stored": 200,
        "duplicate": 200,
        "json": 200,
        "no token": 401,
        "unknown token": 401,
        "other scheme": 401,
        "another node's token": 403,
        "read role": 403,
        "content type": 415,
        "bad gzip": 400,
        "too large": 413,
        "not a batch": 400,
        "get": 405,
        "failure": 500,
    }
    assert {name: a[0] for name, a in direct.items()} == expected
    assert direct["stored"][1] == {"batch_id": "b1", "accepted": 3, "duplicate": False}
    assert direct["duplicate"][1] == {"batch_id": "b1", "accepted": 0, "duplicate": True}
    assert direct["failure"][1]["error"] == "internal_error"
