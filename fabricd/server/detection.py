"""The detection loop: feeds stored samples to a pluggable ``Detector``, stores its incidents.

Ingest only writes; this loop reads the stored stream with a persisted cursor
(``SampleSource.read``), so a slow detector delays incidents, never ingest, and a restart resumes
where it stopped. The detector itself (``fabricd/detect/``) is plugged in through
``create_app(settings, detector_factory=...)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from fabricd import logs
from fabricd.model import Incident, Sample
from fabricd.server.metrics import ServerMetrics
from fabricd.server.store.protocols import IncidentSink, SampleSource, TopologyReader
from fabricd.server.store.records import NotFound
from fabricd.settings import ServerSettings

log = logging.getLogger("fabricd.server.detection")
CURSOR = "detection"


class Detector(Protocol):
    def process(self, samples: Sequence[tuple[str, Sample]]) -> list[Incident]: ...


DetectorFactory = Callable[[ServerSettings, TopologyReader], Detector]
# Called after each stored incident change: (incident id, transition, incident); e.g. alert hooks.
IncidentListener = Callable[[int, str, Incident], None]


class DetectionLoop:
    def __init__(
        self,
        stream: SampleSource,
        incidents: IncidentSink,
        detector: Detector,
        metrics: ServerMetrics,
        listeners: Sequence[IncidentListener] = (),
        clock: Callable[[], float] = time.time,
        chunk: int = 20_000,
    ) -> None:
        self.stream, self.incidents, self.detector, self.metrics = stream, incidents, detector, metrics
        self.listeners, self.clock, self.chunk = list(listeners), clock, chunk
        self.cursor = stream.cursor(CURSOR)

    def step(self) -> int:
        """Process one chunk of stored samples; returns how many (0 = caught up)."""
        deliveries, cursor = self.stream.read(self.cursor, self.chunk)
        samples = [(d.node, s) for d in deliveries for s in d.samples]
        if not samples:
            self.metrics.detection_backlog.set(0)
            return 0
        incidents = self.detector.process(samples)
        now = self.clock()
        for inc in incidents:
            iid, transition = self.incidents.upsert(inc)
            self._notify(iid, transition, inc)
        self.cursor = cursor
        self.stream.save_cursor(CURSOR, cursor)
        self.metrics.detection_lag.set(max(0.0, now - max(s.ts for _, s in samples)))
        self.metrics.detection_backlog.set(max(0, self.stream.head() - cursor))
        return len(samples)

    def _notify(self, iid: int, transition: str, inc: Incident) -> None:
        for listener in self.listeners:
            try:
                listener(iid, transition, inc)
            except Exception:  # one broken hook must not stop detection
                logs.event(log, logging.ERROR, "incident listener failed", incident=iid, transition=transition)


class EngineDetector:
    """The default detector: ``fabricd.detect``'s engine, following the topology stored in the service.

    The topology (``PUT /api/v1/topology``) is re-read when it changes, checked at most every
    ``topology_check_seconds`` of wall time; that is polling of configuration, not detection time:
    the engine itself runs on the samples' timestamps only.
    """

    def __init__(
        self, settings: ServerSettings, topology: TopologyReader, topology_check_seconds: float = 10.0
    ) -> None:
        from fabricd.detect.engine import DetectionEngine

        self.engine = DetectionEngine(rule_paths=[settings.rules_dir] if settings.rules_dir else None)
        self.topology = topology
        self.topology_check_seconds = topology_check_seconds
        self._topology_ts: float | None = None
        self._next_check = 0.0

    def process(self, samples: Sequence[tuple[str, Sample]]) -> list[Incident]:
        self._refresh_topology()
        return self.engine.process(samples)

    def _refresh_topology(self) -> None:
        from fabricd.topology import from_doc, routes_of

        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self.topology_check_seconds
        try:
            row = self.topology.get()
        except NotFound:
            return
        if row.updated_ts != self._topology_ts:
            try:
                topology = from_doc(row.doc)
                self.engine.set_topology(topology, routes_of(row.doc, topology) or None)
            except (ValueError, KeyError) as exc:
                logs.event(log, logging.ERROR, "stored topology is invalid; keeping the previous one", error=str(exc))
            self._topology_ts = row.updated_ts
            logs.event(log, logging.INFO, "detection topology loaded", updated_ts=row.updated_ts)
