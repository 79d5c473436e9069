"""A small typed model of the fabric: nodes, HCA ports, switches and the links between them.

Element ids are strings a user can read and detectors can join on (localization, the simulator):

- node ``node-007``; HCA port ``node-007/mlx5_3``; switch ``leaf-01`` / ``spine-02``;
- host link ``node-007/mlx5_3~leaf-01`` (HCA port first); fabric link ``leaf-01~spine-02`` (lower
  tier first, then by name). Parallel cables between the same two switches are one fabric link
  element (a trunk) whose ``ports`` lists every cable.

``paths(src, dst)`` returns the candidate element sets a flow between two nodes may use: one set per
shortest switch path (ECMP over spines on a two-level leaf/spine) and HCA pairing.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LEAF = "leaf"
SPINE = "spine"
MAX_PATHS = 256  # bound on enumerated ECMP paths per HCA pair (a 2-level fabric has one per spine)


@dataclass(frozen=True, slots=True)
class Switch:
    id: str
    tier: str = LEAF
    guid: str = ""


@dataclass(frozen=True, slots=True)
class HcaPort:
    id: str  # "<node>/<device>"
    node: str
    device: str
    port: int = 1
    guid: str = ""


@dataclass(frozen=True, slots=True)
class Link:
    id: str
    a: str  # HCA port id or switch id (lower end)
    b: str  # switch id
    kind: str  # "host" or "fabric"
    ports: tuple[tuple[int, int], ...] = ()  # (a port, b port) per cable, when known


@dataclass(slots=True)
class Topology:
    link_layer: str = "infiniband"
    nodes: dict[str, list[str]] = field(default_factory=dict)  # node -> its HCA port ids
    hca_ports: dict[str, HcaPort] = field(default_factory=dict)
    switches: dict[str, Switch] = field(default_factory=dict)
    links: dict[str, Link] = field(default_factory=dict)

    # --- building ------------------------------------------------------------------------------

    def add_switch(self, switch: Switch) -> None:
        self.switches.setdefault(switch.id, switch)

    def add_hca_port(self, hca: HcaPort) -> None:
        if hca.id not in self.hca_ports:
            self.hca_ports[hca.id] = hca
            self.nodes.setdefault(hca.node, []).append(hca.id)

    def connect_host(self, hca_id: str, switch_id: str, ports: tuple[int, int] | None = None) -> Link:
        return self._connect(hca_id, switch_id, "host", ports)

    def connect_switches(self, one: str, other: str, ports: tuple[int, int] | None = None) -> Link:
        first, second = sorted((one, other), key=self._switch_order)
        if ports is not None and first != one:
            ports = (ports[1], ports[0])
        return self._connect(first, second, "fabric", ports)

    def _switch_order(self, switch_id: str) -> tuple[int, str]:
        tier = self.switches[switch_id].tier if switch_id in self.switches else LEAF
        return (0 if tier == LEAF else 1, switch_id)

    def _connect(self, a: str, b: str, kind: str, ports: tuple[int, int] | None) -> Link:
        link_id = f"{a}~{b}"
        old = self.links.get(link_id)
        cables = (old.ports if old else ()) + ((ports,) if ports else ())
        self.links[link_id] = Link(link_id, a, b, kind, tuple(sorted(set(cables))))
        return self.links[link_id]

    # --- queries -------------------------------------------------------------------------------

    def elements(self) -> set[str]:
        return set(self.nodes) | set(self.hca_ports) | set(self.switches) | set(self.links)

    def uplink(self, hca_id: str) -> Link | None:
        """The host link of an HCA port (None when it is not cabled)."""
        return next((link for link in self.links.values() if link.kind == "host" and link.a == hca_id), None)

    def _switch_neighbours(self) -> dict[str, list[tuple[str, str]]]:
        adj: dict[str, list[tuple[str, str]]] = {s: [] for s in self.switches}
        for link in self.links.values():
            if link.kind == "fabric":
                adj.setdefault(link.a, []).append((link.id, link.b))
                adj.setdefault(link.b, []).append((link.id, link.a))
        return adj

    def paths(self, src_node: str, dst_node: str) -> list[frozenset[str]]:
        """Candidate element sets for traffic from ``src_node`` to ``dst_node``.

        HCAs are paired by index (rail-matched, as NCCL does when both nodes have the same HCA
        count), otherwise every pair is a candidate. Each pair contributes one set per shortest
        switch path. A node talking to itself uses no fabric: ``[]``.
        """
        if src_node not in self.nodes or dst_node not in self.nodes:
            raise KeyError(f"unknown node: {src_node if src_node not in self.nodes else dst_node}")
        if src_node == dst_node:
            return []
        adj = self._switch_neighbours()
        found: set[frozenset[str]] = set()
        for src_hca, dst_hca in self._hca_pairs(src_node, dst_node):
            found.update(self._pair_paths(src_hca, dst_hca, adj))
        return sorted(found, key=lambda s: sorted(s))

    def _hca_pairs(self, src: str, dst: str) -> Iterator[tuple[str, str]]:
        a, b = sorted(self.nodes[src]), sorted(self.nodes[dst])
        if len(a) == len(b):
            yield from zip(a, b, strict=True)
        else:
            yield from ((x, y) for x in a for y in b)

    def _pair_paths(
        self, src_hca: str, dst_hca: str, adj: dict[str, list[tuple[str, str]]]
    ) -> Iterator[frozenset[str]]:
        up, down = self.uplink(src_hca), self.uplink(dst_hca)
        if up is None or down is None:
            return
        ends = {self.hca_ports[src_hca].node, src_hca, up.id, self.hca_ports[dst_hca].node, dst_hca, down.id}
        for hops in _shortest_switch_paths(adj, up.b, down.b):
            yield frozenset(ends | set(hops))


def _shortest_switch_paths(adj: dict[str, list[tuple[str, str]]], src: str, dst: str) -> Iterator[list[str]]:
    """Every shortest path src -> dst as the list of switch and fabric-link ids on it (bounded)."""
    dist = {src: 0}
    queue = deque([src])
    while queue:
        here = queue.popleft()
        for _, there in adj.get(here, []):
            if there not in dist:
                dist[there] = dist[here] + 1
                queue.append(there)
    if dst not in dist:
        return
    count = 0
    stack: list[tuple[str, list[str]]] = [(dst, [dst])]
    while stack and count < MAX_PATHS:  # walk back from dst along strictly decreasing distance
        here, hops = stack.pop()
        if here == src:
            count += 1
            yield hops
            continue
        for link_id, there in adj.get(here, []):
            if dist.get(there) == dist[here] - 1:
                stack.append((there, [*hops, link_id, there]))


# ---------------------------------------------------------------------------------------------
# Constructors
# ---------------------------------------------------------------------------------------------


def fat_tree(
    nodes: int, hcas_per_node: int, nodes_per_leaf: int, spines: int, link_layer: str = "infiniband"
) -> Topology:
    """A two-level leaf/spine: ``node-001..``, each with HCAs ``mlx5_0..`` on its group's leaf
    ``leaf-01..``; every leaf has one uplink to every spine ``spine-01..``."""
    if min(nodes, hcas_per_node, nodes_per_leaf, spines) < 1:
        raise ValueError("fat_tree needs at least one node, HCA, node per leaf and spine")
    topo = Topology(link_layer=link_layer)
    leaves = -(-nodes // nodes_per_leaf)
    for s in range(1, spines + 1):
        topo.add_switch(Switch(f"spine-{s:02d}", SPINE))
    for leaf in range(1, leaves + 1):
        topo.add_switch(Switch(f"leaf-{leaf:02d}", LEAF))
        for s in range(1, spines + 1):
            topo.connect_switches(f"leaf-{leaf:02d}", f"spine-{s:02d}", (nodes_per_leaf * hcas_per_node + s, leaf))
    for n in range(1, nodes + 1):
        leaf_no = (n - 1) // nodes_per_leaf + 1
        for h in range(hcas_per_node):
            hca = HcaPort(f"node-{n:03d}/mlx5_{h}", f"node-{n:03d}", f"mlx5_{h}")
            topo.add_hca_port(hca)
            leaf_port = ((n - 1) % nodes_per_leaf) * hcas_per_node + h + 1
            topo.connect_host(hca.id, f"leaf-{leaf_no:02d}", (1, leaf_port))
    return topo


def from_yaml(path: Path) -> Topology:
    """A topology file: either ``fat_tree: {nodes, hcas_per_node, nodes_per_leaf, spines}`` or explicit
    ``switches: [{id, tier}]``, ``nodes: [{id, hcas: [mlx5_0, ...]}]``, ``links: [{a, b}]``."""
    doc = yaml.safe_load(path.read_text()) or {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a topology file is a mapping")
    layer = str(doc.get("link_layer", "infiniband"))
    if "fat_tree" in doc:
        return fat_tree(**doc["fat_tree"], link_layer=layer)
    return _explicit(doc, layer)


Routes = dict[tuple[str, str], list[str]]  # (src node, dst node) -> the elements its packets cross


def to_doc(topo: Topology, routes: Routes | None = None) -> dict[str, Any]:
    """The REST API's topology document (``PUT /api/v1/topology``): elements, links and, when
    known, the routes between probed nodes (traceroute / ibtracert, or the switches' ECMP hash)."""
    elements: list[dict[str, Any]] = [
        {"id": sw.id, "type": "switch", "tier": sw.tier, "guid": sw.guid} for sw in topo.switches.values()
    ]
    elements += [
        {
            "id": h.id,
            "type": "hca_port",
            "node": h.node,
            "device": h.device,
            "port": h.port,
            "guid": h.guid,
            "link_layer": topo.link_layer,
        }
        for h in topo.hca_ports.values()
    ]
    links = [{"a": link.a, "b": link.b} for link in topo.links.values()]
    doc: dict[str, Any] = {"elements": elements, "links": links}
    if routes:
        doc["routes"] = [{"src": src, "dst": dst, "elements": list(path)} for (src, dst), path in routes.items()]
    return doc


def routes_of(doc: dict[str, Any], topo: Topology) -> Routes:
    """The document's routes, checked against ``topo``; raises ValueError naming a bad route."""
    known = topo.elements()
    routes: Routes = {}
    for i, route in enumerate(doc.get("routes") or []):
        src, dst, path = str(route.get("src", "")), str(route.get("dst", "")), route.get("elements") or []
        if src not in topo.nodes or dst not in topo.nodes:
            raise ValueError(f"routes[{i}]: src {src!r} and dst {dst!r} must be nodes of the topology")
        unknown = [str(e) for e in path if str(e) not in known]
        if unknown:
            raise ValueError(f"routes[{i}] ({src} -> {dst}): unknown element(s) {', '.join(unknown[:5])}")
        routes[(src, dst)] = [str(e) for e in path]
    return routes


def from_doc(doc: dict[str, Any]) -> Topology:
    """Inverse of ``to_doc``; raises ValueError naming a link with an unknown end."""
    elements = doc.get("elements", [])
    layers = {str(e.get("link_layer")) for e in elements if e.get("type") == "hca_port" and e.get("link_layer")}
    explicit = {
        "switches": [e for e in elements if e.get("type") == "switch"],
        "nodes": [
            {
                "id": node,
                "hcas": [str(e["device"]) for e in elements if e.get("type") == "hca_port" and e.get("node") == node],
            }
            for node in dict.fromkeys(str(e["node"]) for e in elements if e.get("type") == "hca_port")
        ],
        "links": doc.get("links", []),
    }
    return _explicit(explicit, layers.pop() if len(layers) == 1 else "infiniband")


def _explicit(doc: dict[str, Any], layer: str) -> Topology:
    topo = Topology(link_layer=layer)
    for sw in doc.get("switches", []):
        topo.add_switch(Switch(str(sw["id"]), str(sw.get("tier", LEAF)), str(sw.get("guid", ""))))
    for node in doc.get("nodes", []):
        for dev in node.get("hcas", []):
            topo.add_hca_port(HcaPort(f"{node['id']}/{dev}", str(node["id"]), str(dev)))
    for link in doc.get("links", []):
        a, b = str(link["a"]), str(link["b"])
        if a in topo.hca_ports:
            topo.connect_host(a, b)
        elif a in topo.switches and b in topo.switches:
            topo.connect_switches(a, b)
        else:
            raise ValueError(f"link {a}~{b}: unknown end (declare nodes and switches first)")
    return topo


# ---------------------------------------------------------------------------------------------
# ibnetdiscover -p
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IbnetEnd:
    type: str  # "CA" or "SW"
    lid: int
    port: int
    guid: str
    desc: str


@dataclass(frozen=True, slots=True)
class IbnetPort:
    """One line of ``ibnetdiscover -p``: a port, its link width/speed and, when cabled, the far end."""

    local: IbnetEnd
    width: str
    speed: str
    remote: IbnetEnd | None = None


_END = r"(?P<{p}type>CA|SW)\s+(?P<{p}lid>\d+)\s+(?P<{p}port>\d+)\s+(?P<{p}guid>0x[0-9a-fA-F]+)"
_IBNET_LINE = re.compile(
    _END.format(p="l") + r"\s+(?P<width>\S+)\s+(?P<speed>\S+)"
    r"(?:\s+-\s+" + _END.format(p="r") + r"\s+\(\s*'(?P<ldesc>[^']*)'\s+-\s+'(?P<rdesc>[^']*)'\s*\)"
    r"|\s+'(?P<odesc>[^']*)'|\s+(?P<bare>\S.*?))?\s*"
)


def parse_ibnetdiscover(text: str) -> list[IbnetPort]:
    """Port lines of ``ibnetdiscover -p`` (``--ports``). Unconnected ports (``4x ???``, or a bare
    speed with no far end) have ``remote=None``; descriptions are stripped of padding spaces."""
    out = []
    for line in text.splitlines():
        m = _IBNET_LINE.fullmatch(line.strip())
        if m is None:
            continue
        desc = m["ldesc"] if m["ldesc"] is not None else (m["odesc"] or m["bare"] or "")
        local = IbnetEnd(m["ltype"], int(m["llid"]), int(m["lport"]), m["lguid"].lower(), desc.strip())
        remote = None
        if m["rtype"]:
            remote = IbnetEnd(m["rtype"], int(m["rlid"]), int(m["rport"]), m["rguid"].lower(), m["rdesc"].strip())
        out.append(IbnetPort(local, m["width"], m["speed"], remote))
    return out


def _clean(desc: str) -> str:
    return re.sub(r"\s+", "_", desc.strip())


def ca_port_id(desc: str, guid: str) -> tuple[str, str]:
    """(node, device) of a CA from its node description: ``'worker20 mlx5_3'`` -> worker20, mlx5_3."""
    words = desc.split(None, 1)
    if not words:
        return guid, "hca"
    return words[0], _clean(words[1]) if len(words) > 1 else "hca"


def switch_ids(ports: Iterable[IbnetPort]) -> dict[str, str]:
    """Switch guid -> element id (its description; the guid is appended when two share one)."""
    descs: dict[str, str] = {}
    for p in ports:
        for end in (p.local, p.remote):
            if end is not None and end.type == "SW":
                descs.setdefault(end.guid, _clean(end.desc) or end.guid)
    counts: dict[str, int] = {}
    for desc in descs.values():
        counts[desc] = counts.get(desc, 0) + 1
    return {guid: desc if counts[desc] == 1 else f"{desc}-{guid}" for guid, desc in descs.items()}


def end_id(end: IbnetEnd, switches: dict[str, str]) -> str:
    """Element id of one end: a switch id, or the ``node/device`` HCA port id."""
    if end.type == "SW":
        return switches[end.guid]
    node, device = ca_port_id(end.desc, end.guid)
    return f"{node}/{device}"


def from_ibnetdiscover(text: str) -> Topology:
    """Topology from ``ibnetdiscover -p``: switches cabled to a CA are leaves, the others spines."""
    ports = parse_ibnetdiscover(text)
    ids = switch_ids(ports)
    leaves = {
        e.guid
        for p in ports
        if p.remote is not None
        for e, other in ((p.local, p.remote), (p.remote, p.local))
        if e.type == "SW" and other.type == "CA"
    }
    topo = Topology(link_layer="infiniband")
    for guid, sid in ids.items():
        topo.add_switch(Switch(sid, LEAF if guid in leaves else SPINE, guid))
    for p in ports:
        for end in (p.local, p.remote):
            if end is not None and end.type == "CA":
                node, device = ca_port_id(end.desc, end.guid)
                topo.add_hca_port(HcaPort(f"{node}/{device}", node, device, end.port, end.guid))
    for p in ports:
        if p.remote is not None:
            _cable(topo, p.local, p.remote, ids)
    return topo


def _cable(topo: Topology, a: IbnetEnd, b: IbnetEnd, ids: dict[str, str]) -> None:
    if a.type == "CA" and b.type == "SW":
        topo.connect_host(end_id(a, ids), ids[b.guid], (a.port, b.port))
    elif a.type == "SW" and b.type == "CA":
        topo.connect_host(end_id(b, ids), ids[a.guid], (b.port, a.port))
    elif a.type == "SW" and b.type == "SW":
        topo.connect_switches(ids[a.guid], ids[b.guid], (a.port, b.port))
    # CA-CA back-to-back cables carry no switch: not part of the switched fabric model.
