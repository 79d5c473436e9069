"""Topology changes as events (issue 16 §2): every ``topology_watch_seconds`` the central compares
what its agents' LLDP and ibnetdiscover (the ``ibfabric`` collector) describe with the stored topology. Each change (new switch, recabled port,
changed cable, link or host gone) and each problem (a link heard from one side only, two ends that
disagree) is logged once as a structured ``topology change`` event when it first appears, and
``fabricd_topology_changes{kind}`` counts those standing now (``problem`` for the problems), so an
alert can fire on them. ``fabricd topology diff`` shows the same list."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fabricd import logs
from fabricd.model import Sample
from fabricd.server.store.protocols import LatestReader, TopologyReader
from fabricd.server.store.records import NotFound
from fabricd.topology.assemble import discovered

IB_CABLES = "cable_info"  # the ibfabric collector's readings of what ibnetdiscover found


def discovery_samples(latest: LatestReader, fresh_since: float) -> list[tuple[str, Sample]]:
    """The ibfabric collector's fresh ``cable_info`` samples (its counters are not topology)."""
    samples = latest.values(source="ibfabric", fresh_since=fresh_since)
    return [(node, s) for node, s in samples if s.reading.name == IB_CABLES]


log = logging.getLogger("fabricd.server.topology")
Gauge = Callable[[str, float], None]  # (kind, value)


class TopologyWatch:
    def __init__(self, latest: LatestReader, topology: TopologyReader, fresh_seconds: float, gauge: Gauge) -> None:
        self.latest, self.topology, self.fresh_seconds, self.gauge = latest, topology, fresh_seconds, gauge
        self._standing: set[tuple[str, str, str]] = set()

    def step(self, now: float) -> list[tuple[str, str, str]]:
        """Compare once; returns the (kind, element, detail) that appeared since the last step."""
        try:
            stored = self.topology.get().doc
        except NotFound:
            stored = None
        lldp = self.latest.values(source="lldp", fresh_since=now - self.fresh_seconds)
        cables = discovery_samples(self.latest, now - self.fresh_seconds)
        if not lldp and not cables:
            return []  # no agent runs the lldp or ibfabric collector: nothing to compare
        found = discovered(lldp, stored, ibfabric=cables)
        standing = {(c.kind, c.element, c.detail) for c in found.changes}
        standing |= {("problem", "", p) for p in found.problems}
        new = sorted(standing - self._standing)
        for kind, element, detail in new:
            logs.event(log, logging.WARNING, "topology change", kind=kind, element=element, detail=detail)
        counts: dict[str, float] = {k: 0.0 for k, _, _ in self._standing}
        for kind, _, _ in standing:
            counts[kind] = counts.get(kind, 0.0) + 1
        for kind, value in counts.items():
            self.gauge(kind, value)
        self._standing = standing
        return new
