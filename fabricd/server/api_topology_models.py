"""API models (pydantic) of the topology and the traced paths: what ``/api/v1/topology*`` and
``/api/v1/paths`` take and return (split from ``api_models.py`` to keep modules small)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class RouteIn(BaseModel):
    src: str = Field(max_length=128, description="node the probes start from")
    dst: str = Field(max_length=128, description="node they go to")
    elements: list[str] = Field(max_length=64, description="element ids the packets cross (ports, links, switches)")
    reply: list[str] | None = Field(
        default=None,
        max_length=64,
        description="element ids the replies to these probes cross, from dst back to src; absent: unknown "
        "(an ECMP fabric hashes the reply's 5-tuple on its own; InfiniBand replies take the dst -> src route)",
    )


class TopologyIn(BaseModel):
    version: int = Field(default=1, description="the document's version (docs/topology.schema.json); 1 today")
    link_layer: str | None = Field(default=None, description="infiniband, roce or ethernet")
    elements: list[dict[str, Any]] = Field(default_factory=list, max_length=100_000)
    links: list[dict[str, Any]] = Field(default_factory=list, max_length=100_000)
    routes: list[RouteIn] = Field(
        default_factory=list,
        max_length=1_000_000,
        description="where probes between two nodes go (traceroute, ibtracert or the switches' ECMP hash); "
        "without them a fault on one of a leaf's uplinks is localized to the leaf",
    )


class TopologyChangeOut(BaseModel):
    kind: str = Field(
        description="switch_added, switch_removed, host_added, host_removed, link_added, link_removed, recabled, cable_changed"
    )
    element: str
    detail: str = ""


class DiscoveredOut(BaseModel):
    document: dict[str, Any] = Field(description="a topology document (docs/topology.schema.json), ready to PUT")
    problems: list[str] = Field(description="links heard from one side only, cables whose two ends disagree")
    changes: list[TopologyChangeOut] = Field(description="what differs from the stored topology")


class RouteOut(RouteIn):
    source: str = Field(
        default="upload", description="upload (PUT /api/v1/topology) or trace (the agents' path tracing)"
    )
    traced_ts: float | None = Field(
        default=None, description="a traced route: when its pair was last traced (event time)"
    )
    version: int | None = Field(default=None, description="a traced route: how many different paths its pair has had")


class TopologyOut(TopologyIn):
    name: str
    updated_ts: float
    routes: list[RouteOut] = Field(  # type: ignore[assignment]
        default_factory=list, description="uploaded routes and the agents' traced ones (newer wins per pair)"
    )


class HopOut(BaseModel):
    ttl: int
    address: str | None = Field(description="the address that answered; null: a silent hop")
    element: str | None = Field(description="the topology element owning the address; null: unknown")


class PathOut(BaseModel):
    node: str = Field(description="the node that traced it: the prober (request), or the responder (reply)")
    peer: str = Field(description="the probed node (request), or the prober whose probes it answers (reply)")
    direction: str = Field(
        default="request",
        description="request: node's probes to peer; reply: node's replies to peer's probes, traced with their 5-tuple",
    )
    src: str
    src_port: int
    dst: str
    dst_port: int
    hops: list[HopOut]
    reached: bool = Field(description="the destination answered the trace")
    version: int = Field(description="how many different paths this pair has had (1: never changed)")
    changed_ts: float = Field(description="when the current path was first traced (event time)")
    traced_ts: float = Field(description="when it was last traced (event time)")
    route: list[str] | None = Field(
        description="the links it crosses, as localization uses them; null: a hop is unknown to the topology"
    )
