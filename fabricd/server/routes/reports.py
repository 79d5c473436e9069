"""``/api/v1/incidents/{id}/report``: the incident report as one self-contained HTML page.

The same report ``fabricd report --incident ID`` writes (fabricd/report/), gathered in-process
through the routes that serve ``/api/v1/...`` (``fabricd/server/report_source.py``). A plain ``def``: FastAPI runs it
in its thread pool, so drawing the plots never blocks the event loop.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import HTMLResponse

from fabricd.perfmodel import Fabric, parse_rate
from fabricd.server.deps import Reader, Svc
from fabricd.server.errors import ApiError
from fabricd.server.routes.common import AUTH_ERRORS, NOT_FOUND
from fabricd.timeparse import parse_duration

router = APIRouter(tags=["incidents"])
_HTML: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/html": {}}, "description": "the report (HTML, plots inlined as PNG)"}
}


@router.get(
    "/api/v1/incidents/{incident_id}/report",
    response_class=HTMLResponse,
    responses={**_HTML, **AUTH_ERRORS, **NOT_FOUND},
    summary="Incident report: evidence, rate plots, pingmesh, NCCL vs model, hottest ports (HTML)",
)
def incident_report(
    svc: Svc,
    who: Reader,
    incident_id: Annotated[int, Path(ge=1, le=2**62, description="the incident's id")],
    pad: Annotated[str, Query(max_length=32, description="context before and after the incident (10m)")] = "10m",
    top: Annotated[int, Query(ge=1, le=100, description="rows of the hottest-ports table")] = 10,
    link_rate: Annotated[
        str | None, Query(min_length=1, max_length=32, description="per-HCA link rate for the model (400G)")
    ] = None,
    hcas_per_node: Annotated[int | None, Query(ge=1, le=64)] = None,
    gpus_per_node: Annotated[int | None, Query(ge=1, le=64)] = None,
    nodes_per_leaf: Annotated[int | None, Query(ge=1, le=4096)] = None,
    nccl_nodes: Annotated[int, Query(ge=1, le=100_000, description="nodes in one NCCL-tests job")] = 2,
) -> HTMLResponse:
    from fabricd.report import ReportQuery, build_report
    from fabricd.server.report_source import ServiceSource

    fabric = _fabric(link_rate, hcas_per_node, gpus_per_node, nodes_per_leaf)
    try:
        query = ReportQuery(
            incident_id=incident_id,
            pad_seconds=_pad(pad),
            top=top,
            fabric=fabric,
            nccl_nodes=nccl_nodes,
            # Each node's own ports (stored from its sysfs) unless the caller describes the hardware.
            hardware="flags" if link_rate or hcas_per_node or gpus_per_node else "nodes",
        )
    except ValueError as exc:
        raise ApiError(422, "invalid_request", f"model parameters: {exc}") from exc
    report = build_report(ServiceSource(svc, who), query, svc.clock())
    return HTMLResponse(report.html)


def _pad(value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ApiError(422, "invalid_request", f"query parameter 'pad': {exc}", field="pad") from exc


def _fabric(link_rate: str | None, hcas: int | None, gpus: int | None, per_leaf: int | None) -> Fabric:
    """The model's fabric: defaults (fabricd/perfmodel.py) overridden by the query parameters given."""
    d = Fabric()
    return Fabric(
        link_rate_bytes_per_second=d.link_rate_bytes_per_second if link_rate is None else _rate(link_rate),
        hcas_per_node=hcas or d.hcas_per_node,
        gpus_per_node=gpus or d.gpus_per_node,
        nodes_per_leaf=per_leaf or d.nodes_per_leaf,
    )


def _rate(value: str) -> float:
    try:
        return parse_rate(value)
    except (ValueError, IndexError) as exc:  # IndexError: a blank value has no first word
        raise ApiError(422, "invalid_request", f"query parameter 'link_rate': {exc}", field="link_rate") from exc
