"""``/api/v1/paths``: each probed pair's traced path, its hops placed in the topology (issue 16 §4).

The agents trace each probe's 5-tuple (``collectors/pingmesh.py``) and send the hop addresses raw;
here each address is mapped to the element owning it (``fabricd.topology.traced``) and the hops to
the links localization uses (``route``; null when a hop is unknown, or no topology is stored).
"""

from __future__ import annotations

from fastapi import APIRouter

from fabricd.server.api_topology_models import HopOut, PathOut
from fabricd.server.deps import LatestDep, PathsDep, Reader, Svc, TopologyDep
from fabricd.server.routed_topology import trace_of
from fabricd.server.routes.common import AUTH_ERRORS
from fabricd.server.store.records import NotFound, PathRecord
from fabricd.topology import Topology, from_doc
from fabricd.topology.traced import address_owners, route_of

router = APIRouter(tags=["topology"])


@router.get(
    "/api/v1/paths",
    response_model=list[PathOut],
    responses=AUTH_ERRORS,
    summary="Traced probe paths: hop addresses, the elements they belong to, the links they cross",
)
def get_paths(svc: Svc, paths: PathsDep, topology: TopologyDep, latest: LatestDep, _who: Reader) -> list[PathOut]:
    records = paths.all()
    try:
        doc = topology.get().doc
    except NotFound:
        doc = None
    traces = [trace_of(p) for p in records]
    lldp = latest.values(source="lldp", fresh_since=svc.clock() - svc.settings.metrics_stale_seconds)
    owners = address_owners(doc, lldp, traces)
    topo = from_doc(doc) if doc is not None else None
    return [_out(p, owners, topo) for p in records]


def _out(p: PathRecord, owners: dict[str, str], topo: Topology | None) -> PathOut:
    hops = [HopOut(ttl=i + 1, address=a, element=owners.get(a) if a else None) for i, a in enumerate(p.hops)]
    route = route_of(topo, trace_of(p), owners) if topo is not None else None
    return PathOut(
        node=p.node,
        peer=p.peer,
        direction=p.direction,
        src=p.src,
        src_port=p.src_port,
        dst=p.dst,
        dst_port=p.dst_port,
        hops=hops,
        reached=p.reached,
        version=p.version,
        changed_ts=p.changed_ts,
        traced_ts=p.traced_ts,
        route=route,
    )
