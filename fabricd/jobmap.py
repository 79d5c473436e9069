"""The join: job -> nodes -> HCAs -> host links -> leaves and spines, and which jobs an incident hurts.

A job's footprint is every topology element its traffic may use: its nodes, the HCAs its GPUs send
through (``fabricd.affinity``; all of a node's HCAs when the agent knows none), their host links,
and every element of the candidate paths (``Topology.paths``: rail-matched HCA pairs, ECMP over
the spines) between each two of its nodes. A job on one leaf crosses no spine; a job on two leaves
crosses every leaf-spine link between them, since ECMP or adaptive routing may put any of its flows
on any of them. A one-node job crosses nothing but its node (NVLink and PCIe carry its traffic).

Nodes whose HCAs attach the same way (the same HCA names on the same leaves) have the same paths,
so the pairwise walk runs over those groups, not over every pair of nodes of a 1,000-node job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fabricd.model import AffectedJob
from fabricd.topology import Topology


@dataclass(frozen=True, slots=True)
class JobPlacement:
    """A job as the central knows it: where it ran (node -> the HCAs it uses there) and when."""

    job_id: str
    user: str
    name: str
    scheduler: str
    nodes: Mapping[str, tuple[str, ...]]  # node -> HCA device names ("" entries: none known)
    first_ts: float
    last_ts: float
    ended_ts: float | None = None

    def overlaps(self, start: float, end: float) -> bool:
        return self.first_ts <= end and (self.ended_ts is None or self.ended_ts >= start)


@dataclass(frozen=True, slots=True)
class Footprint:
    elements: frozenset[str]
    by_node: Mapping[str, frozenset[str]] = field(default_factory=dict)


def _hca_ports(topo: Topology, node: str, devices: Sequence[str]) -> list[str]:
    ports = topo.nodes.get(node, [])
    wanted = set(devices)
    chosen = [p for p in ports if topo.hca_ports[p].device in wanted] if wanted else []
    return sorted(chosen or ports)


def _own(topo: Topology, node: str, ports: Sequence[str]) -> set[str]:
    out = {node, *ports}
    for port in ports:
        link = topo.uplink(port)
        if link is not None:
            out |= {link.id, link.b}
    return out


def _signature(topo: Topology, ports: Sequence[str]) -> tuple[tuple[str, str], ...]:
    sig = []
    for port in ports:
        link = topo.uplink(port)
        sig.append((topo.hca_ports[port].device, link.b if link else ""))
    return tuple(sig)


def _fabric(topo: Topology, a: str, b: str, ports: set[str]) -> set[str]:
    """Switches and fabric links on the paths between two nodes, using only the job's HCAs."""
    out: set[str] = set()
    for path in topo.paths(a, b):
        if {e for e in path if e in topo.hca_ports} <= ports:
            out |= {e for e in path if _in_fabric(topo, e)}
    return out


def _in_fabric(topo: Topology, element: str) -> bool:
    link = topo.links.get(element)
    return element in topo.switches or (link is not None and link.kind == "fabric")


def footprint(topo: Topology, nodes: Mapping[str, Sequence[str]]) -> Footprint:
    """Every element the job's traffic may use, overall and per node."""
    known = {n: _hca_ports(topo, n, hcas) for n, hcas in nodes.items() if n in topo.nodes}
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for node in sorted(known):
        groups.setdefault(_signature(topo, known[node]), []).append(node)
    reps = list(groups.values())
    shared: dict[int, set[str]] = {i: set() for i in range(len(reps))}
    for i, first in enumerate(reps):
        for j in range(i, len(reps)):
            a, b = first[0], reps[j][-1]
            if a == b:
                continue  # one node alone in its group talks to no peer of the same attachment
            crossed = _fabric(topo, a, b, set(known[a]) | set(known[b]))
            shared[i] |= crossed
            shared[j] |= crossed
    if len(known) == 1:  # a one-node job talks over NVLink/PCIe: its traffic never leaves the node
        (node,) = known
        return Footprint(frozenset({node}), {node: frozenset({node})})
    by_node = {n: frozenset(_own(topo, n, known[n]) | shared[i]) for i, group in enumerate(reps) for n in group}
    everything = frozenset().union(*by_node.values()) if by_node else frozenset()
    return Footprint(everything, by_node)


def affected_jobs(
    element: str, start: float, end: float, jobs: Iterable[JobPlacement], footprints: Mapping[str, Footprint]
) -> list[AffectedJob]:
    """The jobs that ran between ``start`` and ``end`` and whose traffic crosses ``element``."""
    out = []
    for job in jobs:
        fp = footprints.get(job.job_id)
        if fp is None or element not in fp.elements or not job.overlaps(start, end):
            continue
        hit = tuple(sorted(n for n, elements in fp.by_node.items() if element in elements))
        out.append(AffectedJob(job.job_id, job.user, job.name, hit))
    return sorted(out, key=lambda j: j.job_id)
