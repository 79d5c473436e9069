"""Which jobs an incident hurts: the detector's incidents, each given its ``affected_jobs``.

Wraps whichever detector the app runs (``create_app(detector_factory=...)``), so the detectors
stay unaware of jobs: after each step, every incident it returned is joined with the jobs that
ran while it was open and whose traffic crosses its element (``fabricd.jobmap``), on the stored
topology. Without a topology, a job is hit only when the element is one of its nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from fabricd import logs
from fabricd.detect.settle import SettlementState
from fabricd.jobmap import Footprint, JobPlacement, affected_jobs, footprint
from fabricd.model import Incident, Inputs
from fabricd.server.detection import Detector
from fabricd.server.store.protocols import JobReader, TopologyReader
from fabricd.server.store.records import Delivery, NotFound
from fabricd.topology import Topology, from_doc

log = logging.getLogger("fabricd.server.jobs")
MAX_CACHED = 10_000  # footprints kept between steps (recomputed when a job's placement changes)
FootprintKey = tuple[str, tuple[tuple[str, tuple[str, ...]], ...]]


class JobAttribution:
    def __init__(self, inner: Detector, jobs: JobReader, topology: TopologyReader) -> None:
        self.inner, self.jobs, self.topology = inner, jobs, topology
        self._topology_ts: float | None = None
        self._topo = Topology()
        self._footprints: dict[FootprintKey, Footprint] = {}

    def expect(self, nodes: Iterable[str], now: float) -> None:
        self.inner.expect(nodes, now)

    def settled(self) -> float | None:
        return self.inner.settled()

    def settlement(self) -> SettlementState:
        return self.inner.settlement()

    def adopt(self, incidents: Sequence[Incident]) -> list[Incident]:
        adopt = getattr(self.inner, "adopt", None)
        return list(adopt(incidents)) if adopt is not None else []

    def incidents(self) -> list[Incident]:
        current = getattr(self.inner, "incidents", None)
        return list(current()) if current is not None else []

    @property
    def rates_only(self) -> bool:
        """The inner detector's (``detection.keep_for``): attribution reads no sample."""
        return bool(getattr(self.inner, "rates_only", False))

    def inputs(self) -> Inputs | None:
        inner = getattr(self.inner, "inputs", None)
        return inner() if inner is not None else None

    def deliver(self, deliveries: Sequence[Delivery], now: float, partial: frozenset[str]) -> list[Incident]:
        incidents = self.inner.deliver(deliveries, now, partial)
        if incidents:
            self._refresh_topology()
        for inc in incidents:
            end = inc.resolved_ts if inc.resolved_ts is not None else inc.updated_ts
            jobs = self.jobs.overlapping(inc.started_ts, end)
            inc.affected_jobs = affected_jobs(inc.element, inc.started_ts, end, jobs, self.footprints(jobs))
        return incidents

    def footprints(self, jobs: Sequence[JobPlacement]) -> dict[str, Footprint]:
        out = {}
        for job in jobs:
            key = (job.job_id, tuple(sorted(job.nodes.items())))
            if key not in self._footprints:
                if len(self._footprints) >= MAX_CACHED:
                    self._footprints.clear()
                self._footprints[key] = _footprint(self._topo, job)
            out[job.job_id] = self._footprints[key]
        return out

    def _refresh_topology(self) -> None:
        try:
            row = self.topology.get()
        except NotFound:
            return
        if row.updated_ts == self._topology_ts:
            return
        try:
            self._topo = from_doc(row.doc)
        except (ValueError, KeyError) as exc:
            logs.event(log, logging.ERROR, "stored topology is invalid; jobs keep the previous one", error=str(exc))
        self._topology_ts, self._footprints = row.updated_ts, {}


def _footprint(topo: Topology, job: JobPlacement) -> Footprint:
    fp = footprint(topo, job.nodes)
    missing = {n: frozenset({n}) for n in job.nodes if n not in fp.by_node}  # nodes the topology lacks
    return Footprint(fp.elements | frozenset(missing), {**fp.by_node, **missing})
