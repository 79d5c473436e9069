"""``/api/v1/series``: rate series of matching counters over a time range, optionally bucketed."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from fabricd.server.api_models import PointOut, SeriesOut
from fabricd.server.deps import Reader, SeriesDep, Svc, when
from fabricd.server.errors import ApiError
from fabricd.server.routes.common import AUTH_ERRORS
from fabricd.server.store.maintenance import downsample
from fabricd.timeparse import HELP, parse_duration

router = APIRouter(tags=["series"])
Text = Annotated[str | None, Query(max_length=128)]
TimeParam = Annotated[str | None, Query(max_length=64, description=HELP)]


@router.get("/api/v1/series", response_model=list[SeriesOut], responses=AUTH_ERRORS, summary="Rate series")
def get_series(
    svc: Svc,
    store: SeriesDep,
    _who: Reader,
    node: Text = None,
    device: Text = None,
    port: Text = None,
    counter: Annotated[str | None, Query(max_length=128, description="raw counter or fabricd name")] = None,
    source: Text = None,
    since: TimeParam = "-15m",
    until: TimeParam = "now",
    step: Annotated[str | None, Query(max_length=32, description="bucket width (30s, 5m); default raw")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="at most this many series")] = 100,
) -> list[SeriesOut]:
    start, end = when(svc, "since", since) or 0.0, when(svc, "until", until)
    end = svc.clock() if end is None else end
    width = _step(step)
    out = []
    for info in store.find_series(node, device, port, counter, source, limit):
        rows = [(p.ts, p.value, p.rate, p.status) for p in store.points(info.id, start, end)]
        if width is not None:
            buckets = downsample(rows, width, counter=info.reading.kind.value == "counter")
            points = [PointOut(ts=b["ts"], value=b["value"], rate=b["rate"], status=b["status"]) for b in buckets]
        else:
            points = [PointOut(ts=ts, value=v, rate=r, status=st) for ts, v, r, st in rows]
        out.append(SeriesOut.of(info, points, width))
    return out


def _step(step: str | None) -> float | None:
    if step is None:
        return None
    try:
        return parse_duration(step)
    except ValueError as exc:
        raise ApiError(422, "invalid_request", f"query parameter 'step': {exc}", field="step") from exc
