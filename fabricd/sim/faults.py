"""What the active faults do to the fabric during one interval, as conditions on elements.

``conditions(fabric, t0, t1)`` folds every fault overlapping ``(t0, t1]`` into per-link, per-port and
per-node conditions scaled by severity and by the fraction of the interval the fault was active.
The traffic model (``fabricd.sim.model``) turns conditions into counter increments, probe results and
NCCL timings. Overlapping faults combine (the worse condition wins, outages add up).

Magnitudes (all scale linearly with severity, documented in docs/simulator.md):

- congestion: ECN-marked fraction of packets crossing the link 2 % + 18 %·s; their throughput
  x (1 - 0.4·s); queueing delay 400 µs·s on probes crossing it.
- lossy_link: packet loss 1 %·s on the link (probes and RDMA packets), symbol errors 5/s·s and
  receive (CRC) errors 2/s·s at an HCA end.
- link_flap: an outage of 2-8 s every 60 s / s, phase from the seed; link_downed per outage.
- pfc_storm: the port pauses its switch (90 % + 10 %·s of the time); the leaf, unable to drain, pauses
  the other hosts on it 30 % + 40 %·s of the time (victims).
- hol_blocking: incast onto the port; its leaf pauses the hosts on it 20 % + 50 %·s of the time and the
  spines pause hosts elsewhere sending into that leaf half as much.
- straggler: the node's collectives take 1 + 1.5·s times longer; no network effect.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from fabricd.sim.fabric import Fabric, stable_hash
from fabricd.sim.scenario import FaultSpec

FLAP_PERIOD_SECONDS = 60.0


@dataclass
class Conditions:
    congestion: dict[str, float] = field(default_factory=dict)  # link -> effective severity
    loss: dict[str, float] = field(default_factory=dict)  # link -> packet loss probability
    lossy_ports: dict[str, float] = field(default_factory=dict)  # HCA port at a lossy host link -> sev
    down: dict[str, float] = field(default_factory=dict)  # link -> fraction of the interval down
    flaps: dict[str, int] = field(default_factory=dict)  # link -> outages starting in the interval
    down_now: set[str] = field(default_factory=set)  # links down at the end of the interval
    storm: dict[str, float] = field(default_factory=dict)  # HCA port -> tx pause fraction
    paused: dict[str, float] = field(default_factory=dict)  # HCA port -> rx pause fraction (victims)
    incast: dict[str, float] = field(default_factory=dict)  # HCA port receiving an incast -> sev
    slow: dict[str, float] = field(default_factory=dict)  # node -> collective slowdown factor (> 1)

    def bump(self, table: dict[str, float], key: str, value: float) -> None:
        table[key] = max(table.get(key, 0.0), value)


def overlap(fault: FaultSpec, t0: float, t1: float) -> float:
    """Fraction of ``(t0, t1]`` (scenario seconds) during which the fault is active."""
    span = min(t1, fault.end) - max(t0, fault.start)
    return max(0.0, span) / (t1 - t0)


def conditions(fabric: Fabric, t0: float, t1: float) -> Conditions:
    cond = Conditions()
    for index, fault in enumerate(fabric.scenario.faults):
        frac = overlap(fault, t0, t1)
        if frac > 0 or (fault.kind == "link_flap" and fault.start < t1 and fault.end > t0):
            _APPLY[fault.kind](fabric, cond, fault, frac, (index, t0, t1))
    return cond


def _congestion(fabric: Fabric, cond: Conditions, f: FaultSpec, frac: float, _ctx: tuple[int, float, float]) -> None:
    cond.bump(cond.congestion, f.at, f.severity * frac)


def _lossy(fabric: Fabric, cond: Conditions, f: FaultSpec, frac: float, _ctx: tuple[int, float, float]) -> None:
    cond.bump(cond.loss, f.at, 0.01 * f.severity * frac)
    port = _hca_end(fabric, f.at)
    if port:
        cond.bump(cond.lossy_ports, port, f.severity * frac)


def _hca_end(fabric: Fabric, link: str) -> str:
    head = link.split("~", 1)[0]
    return head if head in fabric.topology.hca_ports else ""


def outages(fabric: Fabric, index: int, fault: FaultSpec) -> list[tuple[float, float]]:
    """The flap schedule of one link_flap fault: (down, up) in scenario seconds, from the seed."""
    rng = random.Random(stable_hash(str(fabric.scenario.seed), "flap", str(index)))
    period = FLAP_PERIOD_SECONDS / fault.severity
    out: list[tuple[float, float]] = []
    t = fault.start + rng.uniform(0.0, min(period, fault.end - fault.start) * 0.25)
    while t < fault.end:
        out.append((t, min(fault.end, t + rng.uniform(2.0, 8.0))))
        t += period * rng.uniform(0.7, 1.3)
    return out


def _flap(fabric: Fabric, cond: Conditions, f: FaultSpec, _frac: float, ctx: tuple[int, float, float]) -> None:
    index, t0, t1 = ctx
    for down, up in outages(fabric, index, f):
        span = min(t1, up) - max(t0, down)
        if span > 0:
            cond.down[f.at] = min(1.0, cond.down.get(f.at, 0.0) + span / (t1 - t0))
        if t0 < down <= t1:
            cond.flaps[f.at] = cond.flaps.get(f.at, 0) + 1
        if down <= t1 < up:
            cond.down_now.add(f.at)


def _storm(fabric: Fabric, cond: Conditions, f: FaultSpec, frac: float, _ctx: tuple[int, float, float]) -> None:
    cond.bump(cond.storm, f.at, (0.9 + 0.1 * f.severity) * frac)
    victim = (0.3 + 0.4 * f.severity) * frac
    leaf = fabric.leaf_of[f.at]
    for port in fabric.ports:
        if port != f.at and fabric.leaf_of[port] == leaf:
            cond.bump(cond.paused, port, victim)


def _hol(fabric: Fabric, cond: Conditions, f: FaultSpec, frac: float, _ctx: tuple[int, float, float]) -> None:
    cond.bump(cond.incast, f.at, f.severity * frac)
    near = (0.2 + 0.5 * f.severity) * frac
    leaf = fabric.leaf_of[f.at]
    for port in fabric.ports:
        if port == f.at:
            continue
        # Pauses spread upstream: the hosts on the root's leaf first, then hosts whose traffic enters
        # that leaf through a spine (the spine's egress into the leaf is paused in turn).
        level = near if fabric.leaf_of[port] == leaf else 0.5 * near * _share_into(fabric, port, leaf)
        if level > 0:
            cond.bump(cond.paused, port, level)


def _share_into(fabric: Fabric, port: str, leaf: str) -> float:
    return min(1.0, sum(fl.share for fl in fabric.flows_from.get(port, ()) if fabric.leaf_of[fl.dst] == leaf))


def _straggler(fabric: Fabric, cond: Conditions, f: FaultSpec, frac: float, _ctx: tuple[int, float, float]) -> None:
    cond.slow[f.at] = max(cond.slow.get(f.at, 1.0), 1.0 + 1.5 * f.severity * frac)


_APPLY = {
    "congestion": _congestion,
    "lossy_link": _lossy,
    "link_flap": _flap,
    "pfc_storm": _storm,
    "hol_blocking": _hol,
    "straggler": _straggler,
}


def first_effect(fabric: Fabric, index: int) -> float:
    """When the fault first changes anything (a flap's first outage; otherwise its start)."""
    fault = fabric.scenario.faults[index]
    if fault.kind == "link_flap":
        schedule = outages(fabric, index, fault)
        return schedule[0][0] if schedule else fault.end
    return fault.start
