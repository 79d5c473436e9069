"""The topology document: what ``PUT /api/v1/topology`` takes, ``fabricd topology discover`` prints
and ``push`` sends. Versioned; its JSON Schema is docs/topology.schema.json.

Version 1::

    {"version": 1, "link_layer": "infiniband",
     "elements": [{"id": "leaf-01", "type": "switch", "tier": "leaf", "guid": "0x..."},
                  {"id": "node-001/mlx5_0", "type": "hca_port", "node": "node-001", "device": "mlx5_0",
                   "port": 1, "guid": "0x...", "netdev": "ens1f0np0"}],
     "links": [{"a": "node-001/mlx5_0", "b": "leaf-01", "cables": [{"a_port": "1", "b_port": "3"}]}],
     "routes": [{"src": "node-001", "dst": "node-003", "elements": ["node-001/mlx5_0~leaf-01", ...]}]}

``from_doc`` checks what a schema cannot: every link end declared, a host link from an HCA port to a
switch, no id used twice; it raises ValueError naming the first problem (the central answers 422
with it). A document without ``version`` is read as version 1 (documents uploaded before it existed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fabricd.topology.model import LEAF, SPINE, HcaPort, Switch, Topology

DOC_VERSION = 1
LINK_LAYERS = ("infiniband", "roce", "ethernet")
Routes = dict[tuple[str, str], list[str]]  # (src node, dst node) -> the elements its packets cross


def to_doc(topo: Topology, routes: Routes | None = None, replies: Routes | None = None) -> dict[str, Any]:
    """The topology document of ``topo`` (and, when known, the routes between probed nodes:
    traceroute / ibtracert, or the switches' ECMP hash; and where their replies go)."""
    elements: list[dict[str, Any]] = [
        {"id": sw.id, "type": "switch", "tier": sw.tier, "guid": sw.guid} for sw in topo.switches.values()
    ]
    for h in topo.hca_ports.values():
        element: dict[str, Any] = {
            "id": h.id,
            "type": "hca_port",
            "node": h.node,
            "device": h.device,
            "port": h.port,
            "guid": h.guid,
            "link_layer": topo.link_layer,
        }
        if h.netdev:
            element["netdev"] = h.netdev
        elements.append(element)
    links: list[dict[str, Any]] = []
    for link in topo.links.values():
        entry: dict[str, Any] = {"a": link.a, "b": link.b}
        if link.ports:
            entry["cables"] = [{"a_port": a, "b_port": b} for a, b in link.ports]
        links.append(entry)
    doc: dict[str, Any] = {"version": DOC_VERSION, "link_layer": topo.link_layer, "elements": elements, "links": links}
    if routes:
        doc["routes"] = [_route(src, dst, path, (replies or {}).get((src, dst))) for (src, dst), path in routes.items()]
    return doc


def _route(src: str, dst: str, path: Sequence[str], reply: Sequence[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"src": src, "dst": dst, "elements": list(path)}
    if reply is not None:
        out["reply"] = list(reply)
    return out


def from_doc(doc: dict[str, Any]) -> Topology:
    """The topology a document describes; raises ValueError naming the first problem."""
    version = doc.get("version", DOC_VERSION)
    if version != DOC_VERSION:
        raise ValueError(f"version {version!r}: this fabricd reads topology documents of version {DOC_VERSION}")
    elements = doc.get("elements") or []
    topo = Topology(link_layer=_layer(doc, elements))
    seen: set[str] = set()
    for i, e in enumerate(elements):
        where = f"elements[{i}]"
        kind, eid = e.get("type"), str(e.get("id") or "")
        if not eid:
            raise ValueError(f"{where}: no id")
        if eid in seen:
            raise ValueError(f"{where}: {eid!r} is declared twice")
        seen.add(eid)
        try:
            if kind == "switch":
                tier = str(e.get("tier", LEAF))
                if tier not in (LEAF, SPINE):
                    raise ValueError(f"{where} ({eid}): tier {tier!r} is not {LEAF} or {SPINE}")
                topo.add_switch(Switch(eid, tier, str(e.get("guid", ""))))
            elif kind == "hca_port":
                topo.add_hca_port(_hca(where, eid, e))
            else:
                raise ValueError(f"{where} ({eid}): type {kind!r} is not switch or hca_port")
        except ValueError as exc:
            raise ValueError(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from exc
    for i, link in enumerate(doc.get("links") or []):
        _add_link(topo, i, link)
    return topo


def _layer(doc: dict[str, Any], elements: list[dict[str, Any]]) -> str:
    layer = doc.get("link_layer")
    if layer is None:  # before version 1 named it: the HCA ports' own, when they agree
        layers = {str(e.get("link_layer")) for e in elements if e.get("type") == "hca_port" and e.get("link_layer")}
        layer = layers.pop() if len(layers) == 1 else "infiniband"
    if layer not in LINK_LAYERS:
        raise ValueError(f"link_layer {layer!r} is not one of {', '.join(LINK_LAYERS)}")
    return str(layer)


def _hca(where: str, eid: str, e: dict[str, Any]) -> HcaPort:
    node, device = str(e.get("node") or ""), str(e.get("device") or "")
    if not node or not device:
        raise ValueError(f"{where} ({eid}): an hca_port needs its node and device")
    if eid != f"{node}/{device}":
        raise ValueError(f"{where}: id {eid!r} must be node/device ({node}/{device})")
    port = e.get("port", 1)
    if not isinstance(port, int) or isinstance(port, bool) or port < 1:
        raise ValueError(f"{where} ({eid}): port {port!r} is not a port number")
    return HcaPort(eid, node, device, port, str(e.get("guid", "")), str(e.get("netdev", "")))


def _add_link(topo: Topology, i: int, link: dict[str, Any]) -> None:
    a, b = str(link.get("a", "")), str(link.get("b", ""))
    where = f"links[{i}] ({a}~{b})"
    cables: list[tuple[str, str] | None] = [
        (str(c.get("a_port", "")), str(c.get("b_port", ""))) for c in link.get("cables") or []
    ] or [None]
    if a in topo.hca_ports and b in topo.switches:
        cabled = topo.uplink(a)
        if cabled is not None and cabled.b != b:
            raise ValueError(f"{where}: {a} is already cabled to {cabled.b} (one HCA port, one cable)")
        for cable in cables:
            topo.connect_host(a, b, cable)
    elif a in topo.switches and b in topo.switches and a != b:
        for cable in cables:
            topo.connect_switches(a, b, cable)
    else:
        unknown = [x for x in (a, b) if x not in topo.hca_ports and x not in topo.switches]
        if unknown:
            raise ValueError(f"{where}: unknown end {', '.join(unknown)} (declare it in elements)")
        raise ValueError(f"{where}: a link joins an HCA port to a switch, or two switches")


def routes_of(doc: dict[str, Any], topo: Topology) -> Routes:
    """The document's routes, checked against ``topo``; raises ValueError naming a bad route."""
    known = topo.elements()
    routes: Routes = {}
    for i, route in enumerate(doc.get("routes") or []):
        src, dst, path = str(route.get("src", "")), str(route.get("dst", "")), route.get("elements") or []
        if src not in topo.nodes or dst not in topo.nodes:
            raise ValueError(f"routes[{i}]: src {src!r} and dst {dst!r} must be nodes of the topology")
        unknown = [str(e) for e in [*path, *(route.get("reply") or [])] if str(e) not in known]
        if unknown:
            raise ValueError(f"routes[{i}] ({src} -> {dst}): unknown element(s) {', '.join(unknown[:5])}")
        routes[(src, dst)] = [str(e) for e in path]
    return routes


ReplyOracle = Callable[[str, str], "list[str] | None"]


def replies_of(doc: dict[str, Any], topo: Topology, routes: Routes) -> ReplyOracle:
    """Where the replies to each probed pair's probes go (docs/detection.md, "Round trips"): the
    route's ``reply`` when the document gives one; on InfiniBand the route from dst back to src (a
    reply is routed to the prober's LID like any packet from dst); else unknown (None): an ECMP
    fabric hashes the reply's own 5-tuple, which a trace of the probe's says nothing about."""
    told = {
        (str(r.get("src", "")), str(r.get("dst", ""))): [str(e) for e in r["reply"]]
        for r in doc.get("routes") or []
        if r.get("reply") is not None
    }
    infiniband = topo.link_layer == "infiniband"

    def reply(src: str, dst: str) -> list[str] | None:
        found = told.get((src, dst))
        if found is None and infiniband:
            found = routes.get((dst, src))
        return found

    return reply
