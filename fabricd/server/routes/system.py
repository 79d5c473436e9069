"""``/healthz`` (process alive), ``/readyz`` (database and schema), ``/metrics``, ``/api/v1/status``."""

from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from fabricd.server import db
from fabricd.server.api_models import SettlementOut, StatusOut
from fabricd.server.deps import IncidentCountsDep, LatestDep, NodesDep, Reader, Svc
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
def status(
    svc: Svc,
    inventory: NodesDep,
    incidents: IncidentCountsDep,
    latest: LatestDep,
    _who: Reader,
) -> StatusOut:
    now = svc.clock()
    states = inventory.node_states(now - svc.settings.node_stale_seconds)
    by_severity: dict[str, int] = {}
    opened = acked = 0
    for c in incidents.open_counts():
        by_severity[c.severity] = by_severity.get(c.severity, 0) + c.count
        opened += c.count if c.state == "open" else 0
        acked += c.count if c.state == "acked" else 0
    return StatusOut(
        nodes=states.nodes,
        nodes_stale=states.stale,
        nodes_unhealthy=states.unhealthy,
        series=inventory.series_count(),
        incidents_open=opened,
        incidents_acked=acked,
        incidents_by_severity=by_severity,
        schema_revision=svc.schema_revision,
        latest_unflushed_series=latest.unflushed(),
        detection_backlog_points=None if svc.detection is None else svc.detection.backlog(),
        settlement=_settlement(svc, now),
    )


def _settlement(svc: Svc, now: float) -> SettlementOut | None:
    if svc.detection is None:
        return None
    st = svc.detection.detector.settlement()
    return SettlementOut(
        settled_ts=st.settled_ts,
        lag_seconds=None if st.settled_ts is None else round(max(0.0, now - st.settled_ts), 3),
        lateness_seconds=st.lateness_seconds,
        max_node_lateness_seconds=round(st.max_node_lateness_seconds, 3),
        nodes=st.nodes,
        nodes_left_out=list(st.left_out),
        late_samples=st.late_samples,
    )
