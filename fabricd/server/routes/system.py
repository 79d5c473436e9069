"""``/healthz`` (process alive), ``/readyz`` (database and schema), ``/metrics``, ``/api/v1/status``."""

from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from fabricd.server import db
from fabricd.server.api_models import StatusOut
from fabricd.server.deps import Reader, Svc
from fabricd.server.metrics import render
from fabricd.server.routes.common import AUTH_ERRORS

router = APIRouter(tags=["system"])


@router.get("/healthz", summary="The process is alive")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="The database answers and its schema is current",
    responses={503: {"description": "not ready; the message says why"}},
)
async def readyz(svc: Svc) -> JSONResponse:
    ok, why = await anyio.to_thread.run_sync(db.is_ready, svc.store.engine)
    if not ok:
        return JSONResponse({"error": "not_ready", "message": why}, status_code=503)
    return JSONResponse({"status": "ready", "message": why})


@router.get(
    "/metrics", summary="Prometheus exposition: fleet view and the service's own metrics", response_class=Response
)
def metrics(svc: Svc) -> Response:
    return Response(render(svc.registry), media_type=CONTENT_TYPE_LATEST)  # text 0.0.4


@router.get("/api/v1/status", response_model=StatusOut, responses=AUTH_ERRORS, summary="Fleet summary")
def status(svc: Svc, _who: Reader) -> StatusOut:
    now = svc.clock()
    stale_after = svc.settings.node_stale_seconds
    nodes = svc.store.nodes()
    stale = sum(1 for n, _h, _c in nodes if now - n.last_seen > stale_after)
    unhealthy = sum(1 for n, h, _c in nodes if now - n.last_seen > stale_after or not all(x.success for x in h))
    by_severity: dict[str, int] = {}
    opened = acked = 0
    for _kind, severity, state, count in svc.store.open_incident_counts():
        by_severity[severity] = by_severity.get(severity, 0) + count
        opened += count if state == "open" else 0
        acked += count if state == "acked" else 0
    return StatusOut(
        nodes=len(nodes),
        nodes_stale=stale,
        nodes_unhealthy=unhealthy,
        series=svc.store.series_count(),
        incidents_open=opened,
        incidents_acked=acked,
        incidents_by_severity=by_severity,
        schema_revision=svc.schema_revision,
        latest_unflushed_series=svc.store.unflushed_latest(),
        detection_backlog_points=None
        if svc.detection is None
        else max(0, svc.store.last_point_id() - svc.detection.cursor),
    )
