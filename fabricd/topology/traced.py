"""Traced paths to routes (issue 16 §4): each hop address mapped to the element that owns it, the
hops to the links they cross (``fabricd.pathtrace.route_links``), merged with the uploaded routes.

An address belongs to an element by, first to last (the first that names it wins):

1. the topology document: ``addresses`` of a switch or an HCA port (an HCA port's address is its
   node's: a host is a hop only as the destination), and its ``guid``: InfiniBand paths
   (ibtracert, the ``ibfabric`` collector) name their hops by switch and port GUIDs;
2. LLDP: the management addresses a neighbour advertises (``mgmt_ip`` of ``neighbor_info``), for
   that neighbour's chassis, which is its element id in a topology discovered from LLDP;
3. the traces themselves: each trace's source address is its node's, its destination its peer's.

A router answers a TTL-expired probe from the interface the probe came in on (Linux, and most
switch OSes unless told to use a loopback), so a switch is placed by its interface addresses: lldpd
advertises those given to ``-m`` / ``configure system ip management pattern``, or the operator lists
them in the document. A hop no source names, or hops the topology cannot join, make no route: the
pair keeps its ECMP alternatives (docs/topology.md, "How localization degrades").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fabricd.model import Sample
from fabricd.pathtrace import Hop, hop_elements, route_links
from fabricd.topology.model import Topology


@dataclass(frozen=True, slots=True)
class Trace:
    """One pair's last traced path, hop addresses raw (None: silent)."""

    node: str
    peer: str
    src: str
    dst: str
    hops: tuple[str | None, ...]
    traced_ts: float
    version: int = 1
    direction: str = "request"  # "reply": node's replies to the prober peer, node's end first


@dataclass(frozen=True, slots=True)
class TracedRoute:
    """A traced route of the probed pair (src, dst): where src's probes went, or (``reply``) where
    dst's replies to them went, from dst back to src."""

    src: str
    dst: str
    elements: list[str]
    traced_ts: float
    version: int
    reply: bool = False


def address_owners(
    doc: Mapping[str, Any] | None, lldp: Iterable[tuple[str, Sample]], traces: Iterable[Trace]
) -> dict[str, str]:
    """Address -> element id, from the three sources above."""
    owners: dict[str, str] = {}
    for e in (doc or {}).get("elements") or []:
        owner = str(e.get("node") or e.get("id")) if e.get("type") == "hca_port" else str(e.get("id"))
        for address in e.get("addresses") or []:
            owners.setdefault(str(address), owner)
        if e.get("guid"):  # InfiniBand hops are GUIDs (ibtracert: collectors/ibfabric.py)
            owners.setdefault(str(e["guid"]), owner)
    for _node, sample in lldp:
        labels = dict(sample.reading.labels)
        if sample.reading.name == "neighbor_info" and labels.get("chassis"):
            for address in filter(None, labels.get("mgmt_ip", "").split(",")):
                owners.setdefault(address, labels["chassis"])
    for t in traces:
        owners.setdefault(t.src, t.node)
        owners.setdefault(t.dst, t.peer)
    return owners


def route_of(topology: Topology, trace: Trace, owners: Mapping[str, str]) -> list[str] | None:
    """The links a trace crossed, or None when a hop is unknown or the topology cannot join them."""
    hops = list(trace.hops)
    while hops and hops[-1] is None:  # silent past the last answer (no echo): what answered is the path
        hops.pop()
    elements = hop_elements([Hop(i + 1, h) for i, h in enumerate(hops)], owners)
    peer = peer_of(topology, trace, owners)
    if not elements or trace.node not in topology.nodes or peer not in topology.nodes:
        return None
    switches = [e for e in elements if e in topology.switches]
    if not switches:
        return None
    src_hca = _hca_on(topology, trace.node, switches[0])
    dst_hca = _hca_on(topology, peer, switches[-1])
    if src_hca is None or dst_hca is None:
        return None
    return route_links(topology, src_hca, dst_hca, elements)


def peer_of(topology: Topology, trace: Trace, owners: Mapping[str, str]) -> str:
    """The trace's far node: as reported, or (a responder knows a prober by its address only) the
    node owning its destination address."""
    if trace.peer in topology.nodes:
        return trace.peer
    return owners.get(trace.dst, trace.peer)


def _hca_on(topology: Topology, node: str, switch: str) -> str | None:
    """The node's HCA port cabled to ``switch`` (the first, by id, when several are)."""
    for hca in sorted(topology.nodes.get(node, [])):
        link = topology.uplink(hca)
        if link is not None and link.b == switch:
            return hca
    return None


def traced_routes(topology: Topology, traces: Sequence[Trace], owners: Mapping[str, str]) -> list[TracedRoute]:
    out = []
    for t in traces:
        elements = route_of(topology, t, owners)
        if elements is None:
            continue
        if t.direction == "reply":  # the pair is (prober, responder); its reply goes responder -> prober
            out.append(TracedRoute(peer_of(topology, t, owners), t.node, elements, t.traced_ts, t.version, reply=True))
        else:
            out.append(TracedRoute(t.node, t.peer, elements, t.traced_ts, t.version))
    return out


def merge_routes(doc: Mapping[str, Any], uploaded_ts: float, traced: Sequence[TracedRoute]) -> list[dict[str, Any]]:
    """The document's routes with the traced ones: per pair, the newer wins (an upload after a trace
    is the operator's word; a trace after the upload is newer knowledge). Uploaded routes are marked
    ``source: upload``, traced ones ``source: trace`` with their ``traced_ts`` and ``version``. A
    traced reply path becomes its pair's ``reply`` (on an uploaded route only when newer than it)."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for r in doc.get("routes") or []:
        merged[(str(r.get("src")), str(r.get("dst")))] = {**r, "source": "upload"}
    for t in traced:
        if t.reply or ((t.src, t.dst) in merged and t.traced_ts < uploaded_ts):
            continue
        merged[(t.src, t.dst)] = {
            "src": t.src,
            "dst": t.dst,
            "elements": t.elements,
            "source": "trace",
            "traced_ts": t.traced_ts,
            "version": t.version,
        }
    for t in traced:  # a traced reply joins its pair's route, unless an upload after it says otherwise
        route = merged.get((t.src, t.dst))
        if t.reply and route is not None and not (route["source"] == "upload" and t.traced_ts < uploaded_ts):
            route["reply"] = t.elements
    return [merged[k] for k in sorted(merged)]
