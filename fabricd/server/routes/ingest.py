"""``POST /api/v1/ingest``: one batch from one agent (wire format: docs/wire-format.md)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from fabricd.model import Kind, Status
from fabricd.server.api_models import ErrorOut, IngestOut
from fabricd.server.auth import bearer_token
from fabricd.server.deps import principal
from fabricd.server.errors import ApiError
from fabricd.server.ingest import MAX_BATCH_ID, MAX_NAME, MAX_NODE, MAX_SOURCE, MAX_UNIT
from fabricd.server.services import Services
from fabricd.wire import MAX_INSTANCE, SUPPORTED_VERSIONS
from fabricd.wire_columns import SAMPLE_FIELDS
from fabricd.wire_v3 import STRING_FIELDS

router = APIRouter(tags=["ingest"])
INGEST_PATH = "/api/v1/ingest"
_TEXT = {"type": "string", "pattern": "^[^\\x00]*$"}
_NUM = {"type": "number"}
_OPT_NUM = {"type": ["number", "null"]}


def _text(max_length: int, min_length: int = 0) -> dict[str, Any]:
    return {**_TEXT, "maxLength": max_length, "minLength": min_length}


# The wire format (fabricd/wire.py, docs/wire-format.md) as JSON Schema, so /docs shows it and
# schemathesis generates batches the server must accept. msgpack carries the same structure.
SAMPLE_ROW = {
    "type": "array",
    "description": "[ts, source, device, port, counter, name, unit, kind, labels, value, rate, status, since]",
    "prefixItems": [
        _NUM,
        _text(MAX_SOURCE),
        _text(128),
        _text(128),
        _text(MAX_NAME),
        _text(MAX_NAME),
        _text(MAX_UNIT),
        {"enum": [k.value for k in Kind]},
        {"type": ["object", "null"], "additionalProperties": _text(128), "propertyNames": _text(MAX_NAME)},
        _NUM,
        _OPT_NUM,
        {"enum": [s.value for s in Status]},
        _OPT_NUM,
    ],
    "minItems": 13,
    "maxItems": 13,
}
HEALTH_ROW = {
    "type": "array",
    "description": "[collector, success, duration_seconds, ts, error, readings]",
    "prefixItems": [_text(MAX_NAME), {"type": "boolean"}, _NUM, _NUM, _TEXT, {"type": "integer", "minimum": 0}],
    "minItems": 6,
    "maxItems": 6,
}
_INDEX = {"type": "integer", "minimum": 0}
_INDICES = {"type": "array", "items": _INDEX, "maxItems": 1000, "description": "an index into 'strings' a sample"}
COLUMNS = {
    "type": "object",
    "description": "v3: one array a field, one item a sample (docs/wire-format.md)",
    "required": list(SAMPLE_FIELDS),
    "properties": {
        **{field: _INDICES for field in STRING_FIELDS},
        "labels": {**_INDICES, "description": "an index into 'labels' a sample"},
        **{field: {"type": "array", "items": _NUM, "maxItems": 1000} for field in ("ts", "value")},
        **{field: {"type": "array", "items": _OPT_NUM, "maxItems": 1000} for field in ("rate", "since")},
    },
}
BATCH_SCHEMA = {
    "type": "object",
    "required": ["v", "node", "id"],
    "properties": {
        "v": {"type": "integer", "enum": list(SUPPORTED_VERSIONS), "description": "wire schema version"},
        "instance": {**_text(MAX_INSTANCE, 1), "description": "v2+: the agent process's random id"},
        "seq": {"type": "integer", "minimum": 1, "description": "v2+: batch number of this instance, from 1"},
        "first_ts": {**_OPT_NUM, "description": "v2+: earliest sample ts (null without samples)"},
        "last_ts": {**_OPT_NUM, "description": "v2+: latest sample ts (null without samples)"},
        "node": _text(MAX_NODE, 1),
        "agent": _text(64),
        "id": _text(MAX_BATCH_ID, 1),
        "ts": _NUM,
        "samples": {"type": "array", "items": SAMPLE_ROW, "maxItems": 1000, "description": "v1 and v2"},
        "strings": {"type": "array", "items": _TEXT, "description": "v3: each distinct string of the columns once"},
        "labels": {
            "type": "array",
            "items": {"type": ["object", "null"], "additionalProperties": _text(128), "propertyNames": _text(MAX_NAME)},
            "description": "v3: each distinct label set once",
        },
        "columns": COLUMNS,
        "health": {"type": "array", "items": HEALTH_ROW, "maxItems": 100},
    },
    # Versions 2 and 3 require the four fields; first_ts/last_ts must also be the samples' own range.
    "allOf": [
        {
            "if": {"properties": {"v": {"enum": [1, 2]}}},
            "then": {"required": ["samples"]},
        },
        {
            "if": {"properties": {"v": {"enum": [2, 3]}}},
            "then": {"required": ["instance", "seq", "first_ts", "last_ts"]},
        },
        {
            "if": {"properties": {"v": {"const": 3}}},
            "then": {"required": ["strings", "labels", "columns"]},
        },
    ],
}
_ERRORS = {
    400: {"model": ErrorOut, "description": "the body is not valid JSON/msgpack/gzip"},
    401: {"model": ErrorOut, "description": "missing, unknown or revoked token"},
    403: {"model": ErrorOut, "description": "the token may not ingest, or is bound to another node"},
    413: {"model": ErrorOut, "description": "body or samples-per-batch limit exceeded"},
    415: {"model": ErrorOut, "description": "unsupported Content-Type or Content-Encoding"},
    422: {
        "model": ErrorOut,
        "description": "an invalid field (named); `unsupported_schema_version` with `supported_versions` "
        "for a wire version this server does not read (the agent keeps the batch and retries later)",
    },
    429: {"model": ErrorOut, "description": "series-per-node limit or load shedding; honour Retry-After"},
}


@router.post(
    INGEST_PATH,
    response_model=IngestOut,
    responses=_ERRORS,  # type: ignore[arg-type]
    summary="Store one batch of samples from an agent",
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "JSON, or msgpack (application/msgpack) of the same structure; gzip allowed",
            "content": {"application/json": {"schema": BATCH_SCHEMA}},
        },
        # What the ``Caller`` dependency declares on the other routes (the token is read below).
        "security": [{"HTTPBearer": []}],
    },
)
async def ingest(request: Request) -> Response:
    """Idempotent by (node, batch id): a retried batch is acknowledged with `duplicate: true`."""
    # Reached through the router only where ``IngestShortcut`` lets a request by (a root path):
    # the route is here for the OpenAPI document, and as the one handler both paths share.
    return await respond(request.app.state.services, request)


async def respond(svc: Services, request: Request) -> Response:
    """The ingest answer to ``request``; raises ``ApiError`` for a refused batch."""
    # Every fleet's agent posts here once a scrape. FastAPI's dependency resolution (services,
    # caller, two headers) and the response model's validation took a tenth of the central's
    # Python time at 1,000 nodes (py-spy --gil, docs/storage.md); this reads them itself.
    headers = request.headers
    who = await principal(svc, bearer_token(headers.get("authorization")))
    result = await svc.ingestor.handle(
        who, request.stream, headers.get("content-type"), headers.get("content-encoding"), headers.get("content-length")
    )
    return JSONResponse({"batch_id": result.batch_id, "accepted": result.accepted, "duplicate": result.duplicate})


class IngestShortcut:
    """ASGI middleware: ``POST /api/v1/ingest`` straight to ``respond``, past FastAPI's router.

    Between the service's error middleware and the route, a request crossed Starlette's
    exception middleware, FastAPI's exit stack, the router's match over every route, the route's
    request-response wrapper and its dependency solver: 37 % of the event loop's Python time at
    1,000 nodes (py-spy --gil at steady state), a tenth of the central's. This is the one route
    every agent calls every scrape. Its errors answer as the service's handlers answer them: an
    ``ApiError`` as its own JSON response here, anything else raised on to the error middleware
    outside (``errors._unexpected``: a 500 in the same shape). Other methods, paths and a request
    under a root path go the router's way (a 405, a 404, the same handler).
    """

    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app, self.services = app, services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != INGEST_PATH
            or scope["method"] != "POST"
            or scope.get("root_path")
        ):
            await self.app(scope, receive, send)
            return
        try:
            response = await respond(self.services, Request(scope, receive))
        except ApiError as exc:
            response = exc.response()
        await response(scope, receive, send)
