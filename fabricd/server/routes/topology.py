"""``/api/v1/topology``: the fabric's elements and links (uploaded by an admin or a discovery job)."""

from __future__ import annotations

from fastapi import APIRouter

from fabricd.server.api_models import TopologyIn, TopologyOut
from fabricd.server.deps import Admin, Reader, Svc
from fabricd.server.errors import not_found
from fabricd.server.routes.common import AUTH_ERRORS, NOT_FOUND
from fabricd.server.store import NotFound

router = APIRouter(tags=["topology"])


@router.get(
    "/api/v1/topology",
    response_model=TopologyOut,
    responses={**AUTH_ERRORS, **NOT_FOUND},
    summary="The current topology",
)
def get_topology(svc: Svc, _who: Reader) -> TopologyOut:
    try:
        row = svc.store.get_topology()
    except NotFound as exc:
        raise not_found(str(exc)) from exc
    return TopologyOut(
        name=row.name, updated_ts=row.updated_ts, elements=row.doc.get("elements", []), links=row.doc.get("links", [])
    )


@router.put("/api/v1/topology", response_model=TopologyOut, responses=AUTH_ERRORS, summary="Replace (admin)")
def put_topology(svc: Svc, _who: Admin, body: TopologyIn) -> TopologyOut:
    svc.store.put_topology(body.model_dump(), svc.clock())
    return get_topology(svc, _who)
