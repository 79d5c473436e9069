"""The detection loop: feeds stored samples to a pluggable ``Detector``, stores its incidents.

Ingest only writes; this loop reads the stored stream with a persisted cursor
(``SampleSource.read``), so a slow detector delays incidents, never ingest, and a restart resumes
where it stopped. The detector settles what it is given in event time (``fabricd.detect.settle``):
it evaluates a moment only once every live node has delivered it, so the loop hands it every
delivery with the processing time it arrived at (the wall clock live; while reading a backlog, the
time the read stands for, ``read_timing.py``), and ticks it even when nothing arrived (a silent
node is left out once its lateness has passed). The cursor is saved only past deliveries whose
samples were all evaluated, so a restart re-reads what the detector still held.

The detector itself (``fabricd/detect/``) is plugged in through
``create_app(settings, detector_factory=...)``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from fabricd import logs
from fabricd.detect.settle import SettlementState

if TYPE_CHECKING:
    from fabricd.detect.engine import DetectionEngine
    from fabricd.detect.settle import SettleParams
from fabricd.model import Incident, IncidentState, Inputs
from fabricd.server.metrics import ServerMetrics
from fabricd.server.read_timing import ReadTiming
from fabricd.server.store.protocols import IncidentSink, SampleSource, TopologyReader
from fabricd.server.store.records import Delivery, Keep, NotFound
from fabricd.settings import ServerSettings

log = logging.getLogger("fabricd.server.detection")
CURSOR = "detection"
REFRESH_SECONDS = 30.0  # event time between two writes of an ongoing incident's updated_ts
# Each stored batch wakes the loop; saving the cursor every step was a write transaction per batch,
# under the write lock ingest waits on. A restart resumes from the saved cursor: one second older
# only re-reads a second of points. The loop steps also when idle, so the last position is saved.
CURSOR_SAVE_SECONDS = 1.0


class Detector(Protocol):
    def expect(self, nodes: Iterable[str], now: float) -> None: ...

    def deliver(self, deliveries: Sequence[Delivery], now: float, partial: frozenset[str]) -> list[Incident]: ...

    def settled(self) -> float | None: ...

    def settlement(self) -> SettlementState: ...

    # Optional: ``inputs() -> Inputs | None``, what the detector reads (None: every sample). The loop
    # then reads only those samples from the stream (``records.Keep``). Optional too: ``rates_only``
    # (True: it never reads a counter's raw value, only its rate; ``keep_for``).


def keep_for(detector: object) -> Keep | None:
    """What the loop reads from the stream for ``detector`` (None: every sample, whole)."""
    inputs: Callable[[], Inputs | None] | None = getattr(detector, "inputs", None)
    wanted = inputs() if inputs is not None else None
    return Keep(wanted, rates_only=getattr(detector, "rates_only", False)) if wanted is not None else None


class CursorSource(Protocol):
    """A sample source whose cursor is not one point id (``PartitionedStream``: one per partition)."""

    def read(
        self, cursor: Any, limit: int = 20_000, upto: Any = None, keep: Keep | None = None
    ) -> tuple[list[Delivery], Any]: ...

    def rewind(self, cursor: Any, since_ts: float) -> Any:
        """The cursor before the first point stored since ``since_ts`` (at most ``cursor``)."""
        ...

    def backlog(self, cursor: Any) -> int: ...

    def cursor(self, name: str) -> Any: ...

    def save_cursor(self, name: str, position: Any) -> None: ...


DetectorFactory = Callable[[ServerSettings, TopologyReader], Detector]
# Called after each stored incident change: (incident id, transition, incident); e.g. alert hooks.
IncidentListener = Callable[[int, str, Incident], None]


class DetectionLoop:
    def __init__(
        self,
        stream: SampleSource | CursorSource,
        incidents: IncidentSink,
        detector: Detector,
        metrics: ServerMetrics,
        listeners: Sequence[IncidentListener] = (),
        clock: Callable[[], float] = time.time,
        chunk: int = 20_000,
        nodes: Iterable[str] = (),
        warmup_seconds: float = 0.0,
    ) -> None:
        self.stream, self.incidents, self.detector, self.metrics = stream, incidents, detector, metrics
        self.listeners, self.clock, self.chunk = list(listeners), clock, chunk
        self.cursor: Any = stream.cursor(CURSOR)  # read up to here
        self.saved: Any = self.cursor  # evaluated up to here (what a restart resumes from)
        self._stored: Any = self.cursor  # ``saved`` as the cursors table has it
        self._stored_at = float("-inf")  # the loop's clock at the last save
        # A correlator taking over rebuilds the engine's state (windows, ``for``, baselines, the open
        # incidents) from the points of the last ``warmup_seconds`` up to the saved cursor, writing
        # nothing: the previous correlator wrote what they yield (fabricd/server/replica.py).
        self._warm: Any = None
        if warmup_seconds > 0:
            self._warm = self.cursor
            self.cursor = cast(CursorSource, stream).rewind(self.cursor, clock() - warmup_seconds)
        self._held: deque[tuple[Any, float]] = deque()  # (cursor after a chunk, newest event time in it)
        self._late_seen = 0
        self._written: dict[str, float] = {}  # incident key -> updated_ts last stored
        self._keep = keep_for(detector)
        # A source of several ordered streams (``PartitionedStream``) says which one holds a node.
        self._reading = ReadTiming(chunk, getattr(stream, "partition_of", None))
        self._expected: list[str] | None = list(nodes)
        # What a previous engine stored open is this one's to confirm, narrow or resolve (a restart,
        # a new correlator): adopted before the warm-up, whose proposals then see them open as the
        # previous engine's did. Otherwise an incident opened before the warm-up's window would stay
        # open in the store for good, and the rebuilt engine could place its fault elsewhere beside it.
        adopt = getattr(detector, "adopt", None)
        adopted = adopt(incidents.unresolved()) if adopt is not None else []
        # Kept until the warm-up ends: what it resolves or narrows of them is written then.
        self._adopted = [(inc.key, inc) for inc in adopted] if self._warm is not None else []

    def step(self) -> int:
        """Read one chunk of stored samples and evaluate what settled; returns how many were read
        (0 = caught up). Called also when nothing is new: settlement moves on with time."""
        if self._warm is not None:
            return self._warm_step()
        deliveries, cursor = self.stream.read(self.cursor, self.chunk, keep=self._keep)
        count = sum(d.read for d in deliveries)
        now = self.clock()
        for inc in self._deliver(deliveries, now):
            self._store(inc)
        self._refresh()
        if count:
            self._held.append((cursor, max(d.newest for d in deliveries)))
            self.cursor = cursor
        self._save(now)
        return count

    def _warm_step(self) -> int:
        """One chunk of the warm-up: fed to the detector, its incidents dropped (already stored)."""
        deliveries, cursor = cast(CursorSource, self.stream).read(
            self.cursor, self.chunk, upto=self._warm, keep=self._keep
        )
        count = sum(d.read for d in deliveries)
        self._deliver(deliveries, self.clock())
        self.cursor = cursor
        if not count:  # every partition is back at its saved cursor: from here on, as always
            self._warm = None
            self._written = {inc.key: inc.updated_ts for inc in getattr(self.detector, "incidents", list)()}
            for key, inc in self._adopted:  # what the warm-up changed of them is news to the store
                if inc.state is IncidentState.RESOLVED or inc.key != key:
                    self._store(inc)
            self._adopted = []
            logs.event(log, logging.INFO, "detection state rebuilt; evaluating from the saved cursor")
        return max(count, 1)

    def _deliver(self, deliveries: Sequence[Delivery], wall: float) -> list[Incident]:
        processing, partial = self._reading.timing(deliveries, wall)
        if self._expected is not None:  # expected from the first read's processing time on
            self.detector.expect(self._expected, processing)
            self._expected = None
        return self.detector.deliver(deliveries, processing, partial)

    def _store(self, inc: Incident) -> None:
        iid, transition = self.incidents.upsert(inc)
        self._notify(iid, transition, inc)
        self._written[inc.key] = inc.updated_ts

    def _save(self, now: float) -> None:
        settled = self.detector.settled()
        while self._held and settled is not None and self._held[0][1] <= settled:
            self.saved = self._held.popleft()[0]
        if self.saved != self._stored and now - self._stored_at >= CURSOR_SAVE_SECONDS:
            self.stream.save_cursor(CURSOR, self.saved)
            self._stored, self._stored_at = self.saved, now
        state = self.detector.settlement()
        self.metrics.observe_settlement(state, now, self._late_seen)
        self._late_seen = state.late_samples
        self.metrics.detection_backlog.set(self.backlog())

    def backlog(self) -> int:
        """Stored points not read yet (among replicas: the partition furthest behind)."""
        if isinstance(self.cursor, int):
            return max(0, cast("SampleSource", self.stream).head() - self.cursor)
        return cast(CursorSource, self.stream).backlog(self.cursor)

    def _refresh(self) -> None:
        """Store the open incidents the detector still confirms, at most every ``REFRESH_SECONDS`` of
        event time each: their ``updated_ts`` moves while the fault goes on, which is not a change of
        state (nobody is notified) but is what "updated" on an incident page must show."""
        current = getattr(self.detector, "incidents", None)  # optional: a detector may keep no book
        if current is None:
            return
        written: dict[str, float] = {}  # only the open ones: the map stays as small as the book
        for inc in current():
            last = self._written.get(inc.key, float("-inf"))
            if inc.updated_ts - last >= REFRESH_SECONDS:
                self.incidents.touch(inc.key, inc.updated_ts)
                last = inc.updated_ts
            written[inc.key] = last
        self._written = written

    def _notify(self, iid: int, transition: str, inc: Incident) -> None:
        for listener in self.listeners:
            try:
                listener(iid, transition, inc)
            except Exception:  # one broken hook must not stop detection
                logs.event(log, logging.ERROR, "incident listener failed", incident=iid, transition=transition)


class EngineFeed:
    """A ``Detector`` around a ``DetectionEngine``: the deliveries go through settlement first
    (``fabricd.detect.feed.Detection``, the same path ``fabricd eval`` replays through)."""

    rates_only = True  # the engine reads a counter's rate, never its raw value (``_absorb``)

    def __init__(self, engine: DetectionEngine, params: SettleParams | None = None) -> None:
        from fabricd.detect.feed import Detection
        from fabricd.detect.settle import Settler

        self.engine = engine
        self.detection = Detection(engine, Settler(params) if params is not None else Settler())

    def expect(self, nodes: Iterable[str], now: float) -> None:
        self.detection.expect(nodes, now)

    def deliver(self, deliveries: Sequence[Delivery], now: float, partial: frozenset[str]) -> list[Incident]:
        for d in deliveries:
            self.detection.offer(d.node, d.samples, now, d.stamps)
        return self.detection.tick(now, partial)

    def inputs(self) -> Inputs:
        return self.engine.inputs()

    def settled(self) -> float | None:
        return self.detection.settlement().settled_ts

    def settlement(self) -> SettlementState:
        return self.detection.settlement()

    def incidents(self) -> list[Incident]:
        """The engine's incidents not yet resolved (``updated_ts``: last confirmed)."""
        return self.engine.incidents()

    def adopt(self, incidents: Sequence[Incident]) -> list[Incident]:
        return self.engine.adopt(incidents)


class EngineDetector(EngineFeed):
    """The default detector: ``fabricd.detect``'s engine, following the topology stored in the service.

    The topology (``PUT /api/v1/topology``) is re-read when it changes, checked at most every
    ``topology_check_seconds`` of wall time; that is polling of configuration, not detection time:
    the engine itself runs on the samples' timestamps only.
    """

    def __init__(
        self, settings: ServerSettings, topology: TopologyReader, topology_check_seconds: float = 10.0
    ) -> None:
        from fabricd.detect.engine import DetectionEngine
        from fabricd.detect.settle import SettleParams

        cfg = settings.settlement
        super().__init__(
            DetectionEngine(rule_paths=[settings.rules_dir] if settings.rules_dir else None),
            SettleParams(cfg.step_seconds, cfg.lateness_seconds, cfg.slack),
        )
        self.topology = topology
        self.topology_check_seconds = topology_check_seconds
        self._topology_ts: float | None = None
        self._next_check = 0.0

    def deliver(self, deliveries: Sequence[Delivery], now: float, partial: frozenset[str]) -> list[Incident]:
        self._refresh_topology()
        return super().deliver(deliveries, now, partial)

    def _refresh_topology(self) -> None:
        from fabricd.topology import from_doc, replies_of, routes_of

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
                routes = routes_of(row.doc, topology)
                self.engine.set_topology(topology, routes or None, replies_of(row.doc, topology, routes))
            except (ValueError, KeyError) as exc:
                logs.event(log, logging.ERROR, "stored topology is invalid; keeping the previous one", error=str(exc))
            self._topology_ts = row.updated_ts
            logs.event(log, logging.INFO, "detection topology loaded", updated_ts=row.updated_ts)
