"""JSON errors an on-call engineer can act on: ``{"error": "<code>", "message": "<what to do>", ...}``.

Every 4xx/5xx the service returns has this shape, including FastAPI's own validation errors and
unknown routes, so scripts can switch on ``error`` and humans can read ``message``.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("fabricd.server")


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}
        self.extra = extra

    def response(self) -> JSONResponse:
        body = {"error": self.code, "message": self.message, **self.extra}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def _api_error(_req: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.response()


def _http_error(_req: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = "no such endpoint; see /docs for the API"
    return ApiError(exc.status_code, code, message, dict(exc.headers or {})).response()


def _where(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    kinds = {"query": "query parameter", "path": "path parameter", "body": "body field", "header": "header"}
    if parts and parts[0] in kinds:
        return f"{kinds[parts[0]]} {'.'.join(parts[1:]) or parts[0]!r}"
    return ".".join(parts) or "request"


def _validation_error(_req: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    parts = [f"{_where(e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors]
    details = [{"where": _where(e.get("loc", ())), "message": str(e.get("msg", ""))} for e in errors]
    return ApiError(422, "invalid_request", "; ".join(parts), details=details).response()


def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return ApiError(500, "internal_error", "the server failed; see its log for details").response()


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)


def not_found(message: str) -> ApiError:
    return ApiError(404, "not_found", message)
