"""The topology's typed values (switches, HCA ports, links) and the candidate paths between nodes.

``paths(src, dst)`` returns the candidate element sets a flow between two nodes may use: one set per
shortest switch path (ECMP over spines on a two-level leaf/spine) and HCA pairing.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum

LEAF = "leaf"
SPINE = "spine"
Cable = tuple[int | str, int | str]  # (a port, b port): a port number or an interface name
MAX_PATHS = 256  # bound on enumerated ECMP paths per HCA pair (a 2-level fabric has one per spine)


class ElementKind(StrEnum):
    """What an element is, as the topology says (issue 15 §7: never guessed from its name)."""

    FABRIC_LINK = "fabric_link"  # switch to switch
    HOST_LINK = "host_link"  # HCA port to its leaf
    HCA = "hca"  # one HCA (RDMA device) port of a host
    SWITCH = "switch"
    NODE = "node"  # a host


@dataclass(frozen=True, slots=True)
class Element:
    """One element resolved from the topology: its kind, the host it belongs to (a node, its HCA
    ports and their host links) and, for a link, its two ends."""

    id: str
    kind: ElementKind
    node: str = ""  # the host of a node, an HCA port or a host link; "" for switches and fabric links
    device: str = ""  # an HCA port's RDMA device (mlx5_0)
    ends: tuple[str, ...] = ()  # a link's (a, b)


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
    netdev: str = ""  # its network interface (RoCE: gid_attrs/ndevs), "" on InfiniBand or unknown


@dataclass(frozen=True, slots=True)
class Link:
    id: str
    a: str  # HCA port id or switch id (lower end)
    b: str  # switch id
    kind: str  # "host" or "fabric"
    # (a port, b port) per cable, when known: IB port numbers ("17") or interface names (LLDP: "swp3")
    ports: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class Topology:
    link_layer: str = "infiniband"
    nodes: dict[str, list[str]] = field(default_factory=dict)  # node -> its HCA port ids
    hca_ports: dict[str, HcaPort] = field(default_factory=dict)
    switches: dict[str, Switch] = field(default_factory=dict)
    links: dict[str, Link] = field(default_factory=dict)
    # HCA port id -> the id of its first host link: uplink() is asked once per HCA port by the
    # diff, the document check and the path code; a scan of every link each time made assembling a
    # 2048-host fabric take 2 s (16 ms per 1000 links per call).
    _uplinks: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    # --- building ------------------------------------------------------------------------------

    def add_switch(self, switch: Switch) -> None:
        if switch.id in self.nodes or switch.id in self.hca_ports:
            raise ValueError(f"element {switch.id!r} is both a host and a switch")
        self.switches.setdefault(switch.id, switch)

    def add_hca_port(self, hca: HcaPort) -> None:
        if hca.node in self.switches or hca.id in self.switches:
            raise ValueError(
                f"element {hca.node if hca.node in self.switches else hca.id!r} is both a host and a switch"
            )
        if hca.id not in self.hca_ports:
            self.hca_ports[hca.id] = hca
            self.nodes.setdefault(hca.node, []).append(hca.id)

    def connect_host(self, hca_id: str, switch_id: str, ports: Cable | None = None) -> Link:
        return self._connect(hca_id, switch_id, "host", ports)

    def connect_switches(self, one: str, other: str, ports: Cable | None = None) -> Link:
        first, second = sorted((one, other), key=self._switch_order)
        if ports is not None and first != one:
            ports = (ports[1], ports[0])
        return self._connect(first, second, "fabric", ports)

    def _switch_order(self, switch_id: str) -> tuple[int, str]:
        tier = self.switches[switch_id].tier if switch_id in self.switches else LEAF
        return (0 if tier == LEAF else 1, switch_id)

    def _connect(self, a: str, b: str, kind: str, ports: Cable | None) -> Link:
        link_id = f"{a}~{b}"
        old = self.links.get(link_id)
        cables = (old.ports if old else ()) + (((str(ports[0]), str(ports[1])),) if ports else ())
        self.links[link_id] = Link(link_id, a, b, kind, tuple(sorted(set(cables), key=_cable_order)))
        if kind == "host":
            self._uplinks.setdefault(a, link_id)
        return self.links[link_id]

    # --- queries -------------------------------------------------------------------------------

    def elements(self) -> set[str]:
        return set(self.nodes) | set(self.hca_ports) | set(self.switches) | set(self.links)

    def element(self, element_id: str) -> Element | None:
        """The element ``element_id`` names, with its kind; None when the topology has no such element."""
        if element_id in self.links:
            link = self.links[element_id]
            if link.kind == "host":
                return Element(link.id, ElementKind.HOST_LINK, self.hca_ports[link.a].node, ends=(link.a, link.b))
            return Element(link.id, ElementKind.FABRIC_LINK, ends=(link.a, link.b))
        if element_id in self.hca_ports:
            hca = self.hca_ports[element_id]
            return Element(hca.id, ElementKind.HCA, hca.node, hca.device)
        if element_id in self.switches:
            return Element(element_id, ElementKind.SWITCH)
        if element_id in self.nodes:
            return Element(element_id, ElementKind.NODE, element_id)
        return None

    def link_between(self, one: str, other: str) -> str | None:
        """The id of the link joining two elements (either order), None when they are not cabled."""
        for link_id in (f"{one}~{other}", f"{other}~{one}"):
            if link_id in self.links:
                return link_id
        return None

    def uplink(self, hca_id: str) -> Link | None:
        """The host link of an HCA port (None when it is not cabled)."""
        link_id = self._uplinks.get(hca_id)
        return self.links[link_id] if link_id is not None else None

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


def _cable_order(cable: tuple[str, str]) -> list[list[str | int]]:
    """Port 2 before port 10, swp2 before swp10."""
    return [[int(x) if x.isdigit() else x for x in re.split(r"(\d+)", p)] for p in cable]


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
