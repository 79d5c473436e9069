"""OpenAPI response descriptions shared by the routes (errors are ``ErrorOut``)."""

from __future__ import annotations

from typing import Any

from fabricd.server.api_models import ErrorOut

AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "missing, unknown or revoked token"},
    403: {"model": ErrorOut, "description": "the token's role does not allow this"},
    422: {"model": ErrorOut, "description": "a parameter is invalid; the message names it"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "no such item"}}
