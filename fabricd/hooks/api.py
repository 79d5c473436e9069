"""REST routes for hooks: list them and send a test notification (``POST /api/v1/hooks/test``).

The server mounts ``router(...)`` with its admin dependency and keeps the dispatcher on
``app.state.hooks``: a test notification pages people, so it is an admin action.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, HTTPException, Request

from fabricd.hooks.dispatcher import HookDispatcher


def _dispatcher(request: Request) -> HookDispatcher:
    hooks = getattr(request.app.state, "hooks", None)
    if not isinstance(hooks, HookDispatcher):
        raise HTTPException(503, "hooks are not running on this server")
    return hooks


def _redacted(url: str) -> str:
    # Slack and many webhook URLs carry their secret in the path: show only where they point.
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def router(dependencies: Sequence[Any] = ()) -> APIRouter:
    r = APIRouter(prefix="/api/v1/hooks", tags=["hooks"], dependencies=list(dependencies))

    @r.get("", summary="Configured alert hooks (URLs reduced to scheme and host)")
    def list_hooks(request: Request) -> list[dict[str, str]]:
        d = _dispatcher(request)
        return [{"name": n, "kind": h.cfg.kind, "target": _redacted(h.cfg.url)} for n, h in d.hooks.items()]

    @r.post("/test", summary="Send a test notification through every hook; outcome per hook")
    async def test_all(request: Request) -> dict[str, str]:
        return await _dispatcher(request).send_test()

    @r.post("/{name}/test", summary="Send a test notification through one hook")
    async def test_one(name: str, request: Request) -> dict[str, str]:
        d = _dispatcher(request)
        if name not in d.hooks:
            raise HTTPException(404, f"no hook named {name!r}; configured: {', '.join(d.hooks) or 'none'}")
        return await d.send_test(name)

    return r
