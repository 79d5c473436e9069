"""``/api/v1/topology``: the fabric's elements, links and probe routes (uploaded by an admin or a discovery job)."""

from __future__ import annotations

from fastapi import APIRouter

from fabricd.server.api_topology_models import DiscoveredOut, TopologyChangeOut, TopologyIn, TopologyOut
from fabricd.server.deps import Admin, LatestDep, Reader, RoutedTopologyDep, Svc, TopologyDep, TopologyStoreDep
from fabricd.server.errors import ApiError, not_found
from fabricd.server.routes.common import AUTH_ERRORS, NOT_FOUND
from fabricd.server.store.protocols import TopologyReader
from fabricd.server.store.records import NotFound
from fabricd.server.topology_watch import discovery_samples
from fabricd.topology import from_doc, routes_of
from fabricd.topology.assemble import discovered

router = APIRouter(tags=["topology"])


@router.get(
    "/api/v1/topology",
    response_model=TopologyOut,
    responses={**AUTH_ERRORS, **NOT_FOUND},
    summary="The topology detection uses: pushed and/or discovered (docs/topology.md), with the agents' traced routes",
)
def get_topology(topology: RoutedTopologyDep, _who: Reader) -> TopologyOut:
    return _current(topology)


def _current(topology: TopologyReader) -> TopologyOut:
    try:
        row = topology.get()
    except NotFound as exc:
        raise not_found(str(exc)) from exc
    return TopologyOut(
        name=row.name,
        updated_ts=row.updated_ts,
        version=row.doc.get("version", 1),
        link_layer=row.doc.get("link_layer"),
        elements=row.doc.get("elements", []),
        links=row.doc.get("links", []),
        routes=row.doc.get("routes", []),
    )


@router.put("/api/v1/topology", response_model=TopologyOut, responses=AUTH_ERRORS, summary="Replace (admin)")
def put_topology(
    svc: Svc, topology: TopologyStoreDep, routed: RoutedTopologyDep, _who: Admin, body: TopologyIn
) -> TopologyOut:
    doc = body.model_dump()
    try:  # refused here, with the reason, rather than logged later by the detection loop
        routes_of(doc, from_doc(doc))
    except (ValueError, KeyError) as exc:
        raise ApiError(422, "invalid_request", f"topology: {exc}") from exc
    topology.put(doc, svc.clock())
    return _current(routed)


@router.get(
    "/api/v1/topology/discovered",
    response_model=DiscoveredOut,
    responses=AUTH_ERRORS,
    summary="The topology the agents' LLDP neighbours and ibnetdiscover describe, its problems and changes against the stored one",
)
def get_discovered(svc: Svc, latest: LatestDep, topology: TopologyDep, _who: Reader) -> DiscoveredOut:
    fresh = svc.clock() - svc.settings.metrics_stale_seconds
    try:
        stored = topology.get().doc
    except NotFound:
        stored = None
    found = discovered(
        latest.values(source="lldp", fresh_since=fresh), stored, ibfabric=discovery_samples(latest, fresh)
    )
    return DiscoveredOut(
        document=found.document,
        problems=found.problems,
        changes=[TopologyChangeOut(kind=c.kind, element=c.element, detail=c.detail) for c in found.changes],
    )
