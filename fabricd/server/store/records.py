"""The typed values the store's roles hand out, and the errors they raise.

Nothing here is a table model: a role reads its rows and returns these, so what reaches the routes,
the detection loop, the exporter and the CLI never holds a session or lazy attributes
(``fabricd/server/api_models.py`` turns them into the API's models).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fabricd.model import Inputs, Kind, Reading, Sample, reads
from fabricd.scrape_rows import BUILD, SHARE, Row

# One stored raw point as ingest writes it and the stream and latest values keep it in memory
# (a plain tuple: tens of thousands a second).
PointRow = Row
# One series as the writer inserted it and ``series_identity`` reads it back: id, node, source,
# device, port, counter, name, unit, kind, labels JSON.
SeriesRow = tuple[int, str, str, str, str, str, str, str, str, str]
KEEP_MAX = 1_000_000  # series whose choice a ``Keep`` remembers (as many as identities.IDENTITY_CACHE_MAX)


class SeriesLimitExceeded(Exception):
    def __init__(self, node: str, limit: int, existing: int, new: int) -> None:
        super().__init__(
            f"node {node!r} would have {existing + new} distinct series, over the limit of {limit} "
            f"(limits.max_series_per_node); {new} new series in this batch were refused"
        )
        self.node, self.limit, self.existing, self.new = node, limit, existing, new


class NotFound(LookupError):
    pass


class Conflict(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class IngestResult:
    batch_id: str
    accepted: int
    duplicate: bool
    new_series: int = 0


@dataclass(frozen=True, slots=True)
class Committed:
    """One batch's points, handed to the writer's listeners right after their transaction committed.

    The points have the consecutive ids ``last_point_id - len(rows) + 1 .. last_point_id`` (one
    writer: a batch's ids are taken under the write lock)."""

    node: str
    rows: Sequence[PointRow]
    last_point_id: int
    series: Sequence[SeriesRow] = ()  # the series this batch created
    sids: tuple[int, ...] = ()  # the rows' series ids, in order (empty: not given)
    ts: float | None = None  # the event time of every row, when the batch is one scrape (None: unknown)
    packed: bytes | None = None  # the rows as one chunk (``chunks.pack``), as the writer stored them


# How a ``Keep`` reads a series' points (the third item of its entries): left out; a Reading per
# point; the series' identity as the reading (``fabricd.scrape_rows``).
SKIP = 0


class Keep:
    """Which series a reader wants, by series id, learned once per series from its identity: the
    reader's ``Inputs`` (source -> the neutral names it reads). The detection loop reads about a
    third of what a node sends (docs/storage.md): the rest is left out before a ``Reading`` or a
    ``Sample`` is built for it, which is most of the cost of a point read.

    ``rates_only``: the reader takes a counter's rate, never its raw value (the detection engine:
    ``DetectionEngine._absorb``), so a counter's samples carry the series' identity as their reading,
    whose ``value`` is 0.0, instead of a ``Reading`` built per point: that build was 40 % of the
    detection loop's CPU a sample (docs/storage.md). Gauges still carry their value."""

    def __init__(self, inputs: Inputs | None, rates_only: bool = False) -> None:
        self.inputs = inputs  # None: every series
        self.rates_only = rates_only
        # series id -> (node, identity, SKIP | BUILD | SHARE): one lookup a point instead of two
        self.known: dict[int, tuple[str, Reading, int]] = {}
        self.plans: dict[str, Any] = {}  # node -> its batches' ``plans.Plan``
        self.layouts: dict[tuple[int, ...], Any] = {}  # the readings' ids -> ``plans.Shared``

    def learn(self, sid: int, idents: Mapping[int, tuple[str, Reading]]) -> tuple[str, Reading, int] | None:
        """The series' entry, or None if it does not exist."""
        ident = idents.get(sid)
        if ident is None:
            return None
        if len(self.known) >= KEEP_MAX:
            self.known.clear()
        node, b = ident
        entry = self.known[sid] = (node, b, self.how(b))
        return entry

    def how(self, b: Reading) -> int:
        """How the reader reads the points of the series whose identity is ``b``."""
        if self.inputs is None or reads(self.inputs, b):
            return SHARE if self.rates_only and b.kind is Kind.COUNTER else BUILD
        return SKIP


class Delivery(NamedTuple):
    """Stored samples of one node, consecutive in ingest order (the unit the stream hands out).

    A reader that names its inputs (``Stream.read``'s ``keep``) gets only those samples; ``rows``
    then counts every point the delivery covers, and ``stamps`` holds the event times of its scrapes
    (each once, in order), so settlement still sees a scrape whose samples were all left out."""

    node: str
    samples: Sequence[Sample]  # a list, or one scrape's stored rows (``fabricd.scrape_rows.ScrapeRows``)
    rows: int = -1  # points read, left-out ones included; -1: len(samples)
    stamps: Sequence[float] | None = None  # None: the samples' own times

    @property
    def read(self) -> int:
        return self.rows if self.rows >= 0 else len(self.samples)

    @property
    def newest(self) -> float:
        """The newest event time the delivery covers (-inf when empty)."""
        if self.stamps is not None:
            return max(self.stamps, default=float("-inf"))
        return max((s.ts for s in self.samples), default=float("-inf"))


@dataclass(frozen=True, slots=True)
class TokenInfo:
    id: int
    role: str
    node: str | None
    note: str
    created_ts: float
    revoked_ts: float | None


@dataclass(frozen=True, slots=True)
class SeriesInfo:
    id: int
    node: str
    reading: Reading  # identity (value 0); the latest point is carried separately
    latest: Sample | None


class PointRecord(NamedTuple):
    ts: float
    value: float
    rate: float | None
    status: str
    step: float  # 0 = raw; else the downsampling bucket width


@dataclass(frozen=True, slots=True)
class CollectorRecord:
    collector: str
    success: bool
    duration_seconds: float
    ts: float
    error: str
    readings: int


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    agent_version: str
    first_seen: float
    last_seen: float  # wall time of the last accepted batch
    batches: int
    samples: int
    series: int
    collectors: tuple[CollectorRecord, ...]


@dataclass(frozen=True, slots=True)
class NodeStates:
    """How many nodes have sent a batch, and how many of them are stale or unhealthy (``Inventory.node_states``)."""

    nodes: int
    stale: int  # last batch older than the stale time
    unhealthy: int  # stale, or a collector whose last run failed


@dataclass(frozen=True, slots=True)
class FleetHealth:
    """Counts over the whole fleet for the central's bounded /metrics (``Inventory.fleet_health``)."""

    reporting: int  # nodes whose last batch is newer than the stale time
    stale: int
    versions: tuple[tuple[str, int], ...]  # (agent version, nodes)
    collectors: tuple[tuple[str, bool, int], ...]  # (collector, last run succeeded, nodes)


@dataclass(frozen=True, slots=True)
class IncidentRecord:
    """A stored incident; the lists are the stored JSON documents (see ``tables.Incident``)."""

    id: int
    key: str
    kind: str
    severity: str
    state: str
    element: str
    summary: str
    started_ts: float
    updated_ts: float
    resolved_ts: float | None
    acked_by: str | None
    acked_ts: float | None
    resolved_by: str | None
    candidates: list[dict[str, Any]]
    affected: list[str]
    evidence: list[dict[str, Any]]
    timeline: list[list[Any]]  # [ts, what, by]
    affected_jobs: list[dict[str, Any]] = field(default_factory=list)  # [{id, user, name, nodes}]
    ambiguous: bool = False  # localization could not tell the candidates apart


@dataclass(frozen=True, slots=True)
class IncidentCount:
    kind: str
    severity: str
    state: str
    count: int


@dataclass(frozen=True, slots=True)
class PathRecord:
    """A probed pair's last traced path (``store/paths.py``); hop addresses raw, None: silent."""

    node: str
    peer: str
    src: str
    src_port: int
    dst: str
    dst_port: int
    hops: tuple[str | None, ...]
    reached: bool
    version: int
    changed_ts: float
    traced_ts: float
    direction: str = "request"  # or "reply": node's replies to the prober peer


@dataclass(frozen=True, slots=True)
class TopologyRecord:
    name: str
    updated_ts: float
    doc: dict[str, Any]


@dataclass(frozen=True, slots=True)
class MaintenanceReport:
    downsampled_points: int
    buckets_written: int
    deleted_points: int
    deleted_batches: int
