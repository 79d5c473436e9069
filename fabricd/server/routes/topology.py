"""``/api/v1/topology``: the fabric's elements, links and probe routes (uploaded by an admin or a discovery job)."""

from __future__ import annotations

from fastapi import APIRouter

from fabricd.server.api_models import TopologyIn, TopologyOut
from fabricd.server.deps import Admin, Reader, Svc, TopologyDep, TopologyStoreDep
from fabricd.server.errors import ApiError, not_found
from fabricd.server.routes.common import AUTH_ERRORS, NOT_FOUND
from fabricd.server.store.protocols import TopologyReader
from fabricd.server.store.records import NotFound
from fabricd.topology import from_doc, routes_of

router = APIRouter(tags=["topology"])


@router.get(
    "/api/v1/topology",
    response_model=TopologyOut,
    responses={**AUTH_ERRORS, **NOT_FOUND},
    summary="The current topology",
)
def get_topology(topology: TopologyDep, _who: Reader) -> TopologyOut:
    return _current(topology)


def _current(topology: TopologyReader) -> TopologyOut:
    try:
        row = topology.get()
    except NotFound as exc:
        raise not_found(str(exc)) from exc
    return TopologyOut(
        name=row.name,
        updated_ts=row.updated_ts,
        elements=row.doc.get("elements", []),
        links=row.doc.get("links", []),
        routes=row.doc.get("routes", []),
    )


@router.put("/api/v1/topology", response_model=TopologyOut, responses=AUTH_ERRORS, summary="Replace (admin)")
def put_topology(svc: Svc, topology: TopologyStoreDep, _who: Admin, body: TopologyIn) -> TopologyOut:
    doc = body.model_dump()
    try:  # refused here, with the reason, rather than logged later by the detection loop
        routes_of(doc, from_doc(doc))
    except (ValueError, KeyError) as exc:
        raise ApiError(422, "invalid_request", f"topology: {exc}") from exc
    topology.put(doc, svc.clock())
    return _current(topology)
