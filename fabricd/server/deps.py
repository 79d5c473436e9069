"""Route dependencies as ``Annotated`` aliases: the services, the caller, parsed time parameters."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fabricd.server.auth import Principal, require_admin, require_read
from fabricd.server.errors import ApiError
from fabricd.server.services import Services
from fabricd.timeparse import parse_time

_bearer = HTTPBearer(auto_error=False, description="a token from `fabricd token create`")


def services(request: Request) -> Services:
    return request.app.state.services


Svc = Annotated[Services, Depends(services)]


def caller(svc: Svc, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
    return svc.auth.authenticate(creds.credentials if creds else None)


Caller = Annotated[Principal, Depends(caller)]


def reader(p: Caller) -> Principal:
    return require_read(p)


def admin(p: Caller) -> Principal:
    return require_admin(p)


Reader = Annotated[Principal, Depends(reader)]
Admin = Annotated[Principal, Depends(admin)]


def when(svc: Services, name: str, value: str | None) -> float | None:
    """A time query parameter (RFC 3339, -15m, now, epoch) -> seconds, or a 422 naming it."""
    if value is None:
        return None
    try:
        return parse_time(value, svc.clock())
    except ValueError as exc:
        raise ApiError(422, "invalid_request", f"query parameter {name!r}: {exc}", field=name) from exc
