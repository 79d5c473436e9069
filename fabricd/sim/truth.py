"""Ground truth: what was injected, where, when, and which elements count as the right answer.

Written to its own file (``truth.json``) next to the simulated hosts; detectors never read it, only
``fabricd eval`` does, after the fact.

- ``correct``: the elements a correct localization may name. A link fault: the link, and for a host
  link also its HCA port (the port and its cable are one thing to replace: the detector can only see
  the HCA end). An HCA-port fault: the port and its host link. A straggler: the node.
- ``scope``: every element the fault visibly touches (its ends, the nodes and ports whose traffic
  or probes cross it, PFC victims). An incident of the right kind inside the scope is the detector
  seeing this fault (perhaps badly localized), not a false positive.
- ``symptom_ts``: the first scrape at which the fault's effect is in the counters (the first scrape
  after its first effect: rates need the interval to close).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from fabricd.sim import faults as faults_mod
from fabricd.sim.fabric import Fabric
from fabricd.sim.scenario import FaultSpec
from fabricd.sim.schedule import first_scrape

# Incident kinds that count as detecting each fault kind.
MATCHING_KINDS: dict[str, frozenset[str]] = {
    "congestion": frozenset({"congestion"}),
    "lossy_link": frozenset({"packet_loss"}),
    "link_flap": frozenset({"link_flap"}),
    "pfc_storm": frozenset({"pfc_storm"}),
    "hol_blocking": frozenset({"hol_blocking"}),
    "straggler": frozenset({"straggler"}),
}


@dataclass(frozen=True)
class Truth:
    index: int
    kind: str
    element: str
    severity: float
    start_ts: float
    end_ts: float
    symptom_ts: float
    correct: tuple[str, ...]
    scope: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["correct"], out["scope"] = list(self.correct), list(self.scope)
        return out


def truths(fabric: Fabric, epoch: float, node_phases: dict[str, float] | None = None) -> list[Truth]:
    """The faults as run. ``node_phases``: the nodes' scrape phases when known (a replay); a live
    run's are the agents' own, and node-local symptoms then get the latest time they can show."""
    sc = fabric.scenario
    out = []
    for i, f in enumerate(sc.faults):
        first = faults_mod.first_effect(fabric, i)
        symptom = (math.floor(first / sc.interval) + 1) * sc.interval
        if f.kind == "straggler":
            # the model shows a fault from the end of the first step it is active in
            effect = (math.floor(first / sc.sim_step) + 1) * sc.sim_step
            symptom = _straggler_symptom(sc.interval, sc.nccl_every, effect, (node_phases or {}).get(f.at))
        out.append(
            Truth(
                i,
                f.kind,
                f.at,
                f.severity,
                epoch + f.start,
                epoch + f.end,
                epoch + symptom,
                tuple(sorted(correct(fabric, f))),
                tuple(sorted(scope(fabric, f))),
            )
        )
    return out


def _straggler_symptom(interval: float, every: float, start: float, phase: float | None) -> float:
    """A slow node shows in its own NCCL-tests results: the first run it launches at a scrape at or
    after ``start`` is reported at the scrape that follows the run (``every`` later). Unknown phase:
    the latest that can be, ``start + interval + every``."""
    if phase is None:
        return start + interval + every
    launch = first_scrape(phase, interval, start)
    return first_scrape(phase, interval, launch + every)


def correct(fabric: Fabric, f: FaultSpec) -> set[str]:
    topo = fabric.topology
    if f.at in topo.links:
        head = f.at.split("~", 1)[0]
        return {f.at, head} if head in topo.hca_ports else {f.at}
    if f.at in topo.hca_ports:
        return {f.at, fabric.host_link[f.at]}
    return {f.at}


def scope(fabric: Fabric, f: FaultSpec) -> set[str]:
    topo = fabric.topology
    out = set(correct(fabric, f))
    if f.at in topo.links:
        link = topo.links[f.at]
        out |= {link.a, link.b}
        for flow in fabric.flows:
            if f.at in flow.links:
                out |= _port_and_node(fabric, flow.src) | _port_and_node(fabric, flow.dst) | set(flow.links)
        for pair in fabric.probes:
            if f.at in pair.links:
                out |= {pair.src, pair.dst} | set(pair.links)
    elif f.at in topo.hca_ports:
        leaf = fabric.leaf_of[f.at]
        out |= {leaf, topo.hca_ports[f.at].node}
        if f.kind in {"pfc_storm", "hol_blocking"}:
            for port in fabric.ports:
                if fabric.leaf_of[port] == leaf or f.kind == "hol_blocking":
                    out |= _port_and_node(fabric, port) | {fabric.host_link[port]}
            out |= {link for link in topo.links if leaf in link.split("~")}
    return out


def _port_and_node(fabric: Fabric, port: str) -> set[str]:
    return {port, fabric.topology.hca_ports[port].node}
