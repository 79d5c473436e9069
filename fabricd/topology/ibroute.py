"""InfiniBand paths (issue 16 §4): which HCA pairs the ``ibfabric`` collector traces, and the
switches a trace crossed.

The collector traces each ordered pair of its ``trace_nodes`` with ``ibtracert`` between their
LIDs (from its ``ibnetdiscover`` run) and reports each path as a ``path_info`` reading, the record
the pingmesh traces use (fabricd/server/pathreports.py): hops are the switches' GUIDs, then the
destination port's. The central places them as it places IP hops (``fabricd.topology.traced``:
an element's ``guid`` in the topology document names it), stores the last path per node pair and
merges it into the routes the localizer follows.

Static routing: the path ibtracert reads from the linear forwarding tables is the path the
packets take, until the SM re-sweeps (hence a new trace after each rediscovery). Adaptive routing
(NVIDIA's ``ar_updn``, on by default in its OpenSM; Quantum switches): a switch may send a packet
out of any port of the destination's AR group, which on a fat tree (the ``TREE`` group algorithm)
is every port with the fewest hops to it; infiniband-diags cannot read AR groups (vendor MADs:
``ibdiagnet -r`` dumps them). With ``adaptive_routing`` the collector reports each pair with no
path, and the pair keeps its equal-cost alternatives (``Topology.paths``), which are exactly that
candidate set on a two- or three-level fat tree.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from fabricd.parsers.ibnetdiscover import IbnetPort
from fabricd.parsers.ibtracert import Trace
from fabricd.topology.ibnet import ca_ids, end_id, switch_ids
from fabricd.topology.model import Topology

SOURCE = "ibfabric"
NAME = "path_info"


def hca_lids(ports: Sequence[IbnetPort]) -> dict[str, tuple[int, str]]:
    """HCA port element id -> (its LID, its port GUID), from ibnetdiscover (LID 0: not known)."""
    switches, cas = switch_ids(ports), ca_ids(ports)
    out: dict[str, tuple[int, str]] = {}
    for p in ports:
        for end in (p.local, p.remote):
            if end is not None and end.type == "CA" and end.lid:
                out.setdefault(end_id(end, switches, cas), (end.lid, end.guid))
    return out


def trace_pairs(topology: Topology, nodes: Sequence[str]) -> Iterator[tuple[str, str]]:
    """One HCA port pair per ordered pair of ``nodes`` that the topology knows: each node's first
    HCA port (by id). Routes are per node pair, and the central keeps one path per pair: tracing
    every rail would replace one rail's path with another's at each trace."""
    known = [n for n in dict.fromkeys(nodes) if n in topology.nodes]
    for src in known:
        for dst in known:
            if src != dst:
                yield min(topology.nodes[src]), min(topology.nodes[dst])


def path_switches(trace: Trace, dst_guid: str) -> list[str] | None:
    """The switch GUIDs of a complete trace that ended at port ``dst_guid``; None otherwise (the
    trace failed, or ended elsewhere: a LID moved since ibnetdiscover ran)."""
    if not trace.complete or not trace.hops or trace.hops[-1].guid != dst_guid:
        return None
    return [h.guid for h in trace.hops if h.type == "SW"]
