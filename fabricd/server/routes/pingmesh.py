"""``/api/v1/pingmesh``: the latest probe results as a (src, dst) matrix.

Built from the pingmesh collector's samples (collectors/pingmesh.py): source ``pingmesh``, device =
the peer probed, gauges ``rtt_p50_seconds``/``rtt_p99_seconds`` and counters ``probes_sent``,
``probes_lost`` and ``probes_late``. Loss is the detectors' (``fabricd.signal_math.loss_ratio``): probes
never answered.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from fabricd.model import Sample
from fabricd.server.api_models import PairOut
from fabricd.server.deps import LatestDep, Reader, Svc, when
from fabricd.server.routes.common import AUTH_ERRORS
from fabricd.signal_math import loss_ratio
from fabricd.timeparse import HELP

router = APIRouter(tags=["pingmesh"])


@router.get(
    "/api/v1/pingmesh",
    response_model=list[PairOut],
    responses=AUTH_ERRORS,
    summary="Probe pair matrix: p50/p99 RTT and loss",
)
def pingmesh(
    svc: Svc, latest: LatestDep, _who: Reader, since: Annotated[str, Query(max_length=64, description=HELP)] = "-5m"
) -> list[PairOut]:
    start = when(svc, "since", since)
    return pairs(latest.values(source="pingmesh", fresh_since=start))


def pairs(latest: list[tuple[str, Sample]]) -> list[PairOut]:
    cells: dict[tuple[str, str], dict[str, float | None]] = {}
    for node, s in latest:
        cell = cells.setdefault((node, s.reading.device), {"ts": 0.0})
        cell["ts"] = max(cell["ts"] or 0.0, s.ts)
        name = s.reading.metric
        if name in ("rtt_p50_seconds", "rtt_p99_seconds"):
            cell[name] = s.reading.value
        elif name in ("probes_sent", "probes_lost", "probes_late"):
            cell[name] = s.rate
    return [_pair(src, dst, c) for (src, dst), c in sorted(cells.items())]


def _pair(src: str, dst: str, c: dict[str, float | None]) -> PairOut:
    loss = loss_ratio((c.get("probes_sent"), c.get("probes_lost") or 0.0, c.get("probes_late")))
    return PairOut(
        src=src,
        dst=dst,
        p50_seconds=c.get("rtt_p50_seconds"),
        p99_seconds=c.get("rtt_p99_seconds"),
        loss_ratio=loss,
        ts=c["ts"] or 0.0,
    )
