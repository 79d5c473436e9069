"""The simulated fabric's static shape: ports, flows, probe pairs and NCCL jobs, with their paths.

Built once per scenario from ``fabricd.topology.fat_tree`` (the same element ids the detectors and
the REST API use). A flow between two HCA ports takes one ECMP path: host link up, the source leaf's
uplink to one spine (picked by a stable hash of the flow, as switches hash the 5-tuple), the
destination leaf's uplink from that spine, host link down. Links are undirected elements here:
a fault on a link affects traffic in both directions.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field

from fabricd.sim.scenario import Scenario
from fabricd.topology import Topology, fat_tree

# Bytes per packet of RDMA traffic: the 4096-byte IB/RoCE path MTU that NCCL uses.
MTU_BYTES = 4096


def stable_hash(*parts: str) -> int:
    """A hash stable across processes (Python's ``hash`` of str is salted per process)."""
    return zlib.crc32("|".join(parts).encode())


@dataclass(frozen=True, slots=True)
class Flow:
    src: str  # HCA port id
    dst: str
    links: tuple[str, ...]
    share: float  # fraction of the source port's line rate at nominal load


@dataclass(frozen=True, slots=True)
class ProbePair:
    src: str  # node
    dst: str
    rail: int
    links: tuple[str, ...]


@dataclass
class Fabric:
    scenario: Scenario
    topology: Topology
    line_bytes_per_second: float
    nodes: list[str]
    leaf_of: dict[str, str]  # node or HCA port -> leaf id
    ports_of: dict[str, list[str]]  # node -> HCA port ids (mlx5_0 ...)
    host_link: dict[str, str]  # HCA port -> host link id
    spines: list[str]
    flows: list[Flow] = field(default_factory=list)
    probes: list[ProbePair] = field(default_factory=list)
    flows_from: dict[str, list[Flow]] = field(default_factory=dict)
    # element id -> the id it has under the default names (node-001, leaf-01): what the simulator
    # hashes and orders by, so ``topology.names`` relabels a scenario without changing what happens
    canonical: dict[str, str] = field(default_factory=dict)

    def key(self, element: str) -> str:
        return self.canonical.get(element, element)

    @property
    def ports(self) -> list[str]:
        return [p for n in self.nodes for p in self.ports_of[n]]

    def path(self, src_port: str, dst_port: str) -> tuple[str, ...]:
        """The links one flow between two HCA ports crosses (one ECMP choice)."""
        up, down = self.host_link[src_port], self.host_link[dst_port]
        src_leaf, dst_leaf = self.leaf_of[src_port], self.leaf_of[dst_port]
        if src_leaf == dst_leaf:
            return (up, down)
        spine = self.spines[stable_hash(self.key(src_port), self.key(dst_port)) % len(self.spines)]
        return (up, f"{src_leaf}~{spine}", f"{dst_leaf}~{spine}", down)

    def rail_port(self, node: str, rail: int) -> str:
        ports = self.ports_of[node]
        return ports[rail % len(ports)]

    def job_links(self, members: list[str]) -> set[str]:
        """Links used by a collective among ``members`` (rail-matched ring between nodes)."""
        links: set[str] = set()
        for a, b in zip(members, members[1:] + members[:1], strict=True):
            if a == b:
                continue
            for rail in range(len(self.ports_of[a])):
                links.update(self.path(self.rail_port(a, rail), self.rail_port(b, rail)))
        return links

    def nccl_partner(self, node: str, run: int) -> str:
        """The peer a node's NCCL-tests run pairs with: rotates every run, so a straggler is the one
        node slow in every run while each healthy node is slow only when paired with it."""
        i = self.nodes.index(node)
        n = len(self.nodes)
        return self.nodes[(i + 1 + run % (n - 1)) % n]


def build(scenario: Scenario) -> Fabric:
    topo = scenario.build_topology()
    canonical = _canonical(scenario, topo)
    nodes = sorted(topo.nodes, key=lambda n: canonical[n])
    ports_of = {n: sorted(topo.nodes[n], key=_device_order) for n in nodes}
    host_link: dict[str, str] = {}
    leaf_of: dict[str, str] = {}
    for link in topo.links.values():
        if link.kind == "host":
            host_link[link.a] = link.id
            leaf_of[link.a] = link.b
            leaf_of[topo.hca_ports[link.a].node] = link.b
    spines = sorted((s.id for s in topo.switches.values() if s.tier == "spine"), key=lambda s: canonical[s])
    fabric = Fabric(
        scenario, topo, scenario.topology.rate_gbps * 125_000_000.0, nodes, leaf_of, ports_of, host_link, spines
    )
    fabric.canonical = canonical
    fabric.flows = _flows(fabric, random.Random(scenario.seed))
    fabric.probes = _probe_pairs(fabric)
    for flow in fabric.flows:
        fabric.flows_from.setdefault(flow.src, []).append(flow)
    return fabric


def _canonical(scenario: Scenario, topo: Topology) -> dict[str, str]:
    """Each element's id under the default names: ``fat_tree`` builds both in the same order."""
    t = scenario.topology
    default = fat_tree(t.nodes, t.hcas_per_node, t.nodes_per_leaf, t.spines, link_layer=t.link_layer)
    pairs = [
        *zip(topo.nodes, default.nodes, strict=True),
        *zip(topo.hca_ports, default.hca_ports, strict=True),
        *zip(topo.switches, default.switches, strict=True),
        *zip(topo.links, default.links, strict=True),
    ]
    return dict(pairs)


def _device_order(port: str) -> int:
    return int(port.rsplit("_", 1)[1])


def _flows(fabric: Fabric, rng: random.Random) -> list[Flow]:
    """Background traffic: a rail-matched ring over all nodes (the allreduce pattern) carrying most of
    the load, plus one random cross-node flow per port (other jobs, alltoall phases) so fabric links
    see uneven, busy-but-healthy load."""
    ring_share = 0.7 if fabric.scenario.workload.kind == "allreduce" else 0.3
    nodes = fabric.nodes
    flows: list[Flow] = []
    for i, node in enumerate(nodes):
        nxt = nodes[(i + 1) % len(nodes)]
        other = nodes[(i + rng.randrange(1, len(nodes))) % len(nodes)]
        for rail, port in enumerate(fabric.ports_of[node]):
            for peer, share in ((nxt, ring_share), (other, 1.0 - ring_share)):
                dst = fabric.rail_port(peer, rail)
                flows.append(Flow(port, dst, fabric.path(port, dst), share))
    return flows


def _probe_pairs(fabric: Fabric) -> list[ProbePair]:
    """Each node probes one neighbour on its own leaf and peers spread over the other leaves."""
    nodes, n = fabric.nodes, len(fabric.nodes)
    wanted = min(fabric.scenario.workload.probe_peers, n - 1)
    pairs: list[ProbePair] = []
    for i, node in enumerate(nodes):
        peers: list[str] = []
        step = max(1, n // (wanted + 1))
        for k in range(1, n):
            if len(peers) >= wanted:
                break
            cand = nodes[(i + (1 if k == 1 else (k - 1) * step + 1)) % n]
            if cand != node and cand not in peers:
                peers.append(cand)
        for peer in peers:
            rail = stable_hash(fabric.key(node), fabric.key(peer)) % len(fabric.ports_of[node])
            src, dst = fabric.rail_port(node, rail), fabric.rail_port(peer, rail)
            pairs.append(ProbePair(node, peer, rail, fabric.path(src, dst)))
    return pairs
