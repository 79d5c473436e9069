"""``/api/v1/nccl``: NCCL-tests results, one entry per (node, op, run time, row labels).

Built from the nccl collector's samples (collectors/nccl.py): source ``nccl``, device = the
collective (``all_reduce``), labels ``size``/``placement`` per table row, gauges such as
``busbw_bytes_per_second``, ``time_seconds``, ``run_success``.
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Query

from fabricd.server.api_models import NcclOut
from fabricd.server.deps import Reader, SeriesDep, Svc, when
from fabricd.server.routes.common import AUTH_ERRORS
from fabricd.timeparse import HELP

router = APIRouter(tags=["nccl"])


@router.get("/api/v1/nccl", response_model=list[NcclOut], responses=AUTH_ERRORS, summary="NCCL-tests results")
def nccl(
    svc: Svc,
    store: SeriesDep,
    _who: Reader,
    node: Annotated[str | None, Query(max_length=128)] = None,
    op: Annotated[str | None, Query(max_length=128, description="all_reduce, all_gather, alltoall, ...")] = None,
    since: Annotated[str, Query(max_length=64, description=HELP)] = "-24h",
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> list[NcclOut]:
    start = when(svc, "since", since) or 0.0
    runs: dict[tuple[str, str, float, str], NcclOut] = {}
    for info in store.find_series(node=node, device=op, source="nccl", limit=5000):
        r = info.reading
        for p in store.points(info.id, start, svc.clock()):
            key = (info.node, r.device, p.ts, json.dumps(r.labels))
            run = runs.get(key) or runs.setdefault(
                key, NcclOut(node=info.node, op=r.device, ts=p.ts, labels=dict(r.labels), values={})
            )
            run.values[r.metric] = p.value
    return sorted(runs.values(), key=lambda x: (-x.ts, x.node, x.op))[:limit]
