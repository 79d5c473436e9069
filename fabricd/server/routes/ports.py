"""``/api/v1/ports``: current rates, errors and pause fraction per port; the hottest first."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from fabricd.portview import PortView, port_views, select_ports
from fabricd.server.api_models import PortOut
from fabricd.server.deps import LatestDep, Reader, Svc
from fabricd.server.routes.common import AUTH_ERRORS

router = APIRouter(tags=["ports"])
SortKey = Literal["throughput", "utilization", "errors", "pause", "xmit_wait", "name"]


@router.get("/api/v1/ports", response_model=list[PortOut], responses=AUTH_ERRORS, summary="Ports, hottest first")
def list_ports(
    svc: Svc,
    latest: LatestDep,
    _who: Reader,
    node: Annotated[str | None, Query(max_length=128, description="only this node")] = None,
    state: Annotated[str | None, Query(max_length=32, description="only ports in this state (ACTIVE, down)")] = None,
    sort: Annotated[SortKey, Query(description="hottest first by this signal")] = "throughput",
    limit: Annotated[int, Query(ge=1, le=10_000, description="top N")] = 50,
) -> list[PortOut]:
    fresh = svc.clock() - svc.settings.metrics_stale_seconds
    views = port_views(latest.values(node=node, fresh_since=fresh))
    return [_out(v) for v in select_ports(views, state, sort, limit)]


def _out(v: PortView) -> PortOut:
    return PortOut(
        node=v.node,
        device=v.device,
        port=v.port,
        state=v.state,
        rx_bytes_per_second=v.rx,
        tx_bytes_per_second=v.tx,
        link_bytes_per_second=v.link,
        utilization=v.utilization,
        errors_per_second=v.errors,
        pause_fraction=v.pause,
        xmit_wait_per_second=v.xmit_wait,
        updated_ts=v.updated_ts,
        netdev=v.netdev,
    )
