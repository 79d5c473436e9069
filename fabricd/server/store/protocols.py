"""The store's seams: one small Protocol per thing a consumer needs, each met by one role.

    consumer                          needs                                role (module)
    Ingestor (server/ingest.py)       BatchSink                            GroupCommitWriter (writer)
    DetectionLoop                     SampleSource, IncidentSink           Stream (stream), Incidents
    EngineDetector                    TopologyReader                       Topologies (topology)
    FleetCollector (/metrics)         LatestReader, NodeReader,            LatestValues (latest),
                                      IncidentCounter                      Inventory, Incidents
    routes                            one or two of the readers/writers    (through deps.py)
    Ingestor, JobAttribution          JobSink, JobReader                   Jobs (jobs)
    Ingestor, RoutedTopology          PathSink, PathReader                 Paths (paths)
    Authenticator (server/auth.py)    TokenLookup                          Tokens (tokens)
    `fabricd token`, bootstrap        TokenAdmin                           Tokens

A test double, or a second implementation (a bulk writer, a stream read per partition), only has
to meet the one Protocol its consumer takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from fabricd.jobmap import JobPlacement
from fabricd.model import Batch, Incident, Sample
from fabricd.server.jobreports import JobReport
from fabricd.server.pathreports import PathReport
from fabricd.server.store.records import (
    Committed,
    Delivery,
    FleetHealth,
    IncidentCount,
    IncidentRecord,
    IngestResult,
    Keep,
    NodeRecord,
    NodeStates,
    PathRecord,
    PointRecord,
    SeriesInfo,
    TokenInfo,
    TopologyRecord,
)


class CommitListener(Protocol):
    """Told of every batch right after its transaction committed, in commit order."""

    def committed(self, batches: Sequence[Committed]) -> None: ...


class BatchSink(Protocol):
    def ingest(self, batch: Batch, now: float, max_series_per_node: int) -> IngestResult:
        """Store one batch; returns once it is durable, or raises what refused it."""
        ...


class SampleSource(Protocol):
    """The stored raw samples in ingest order, read with a cursor (a point id) that can be saved."""

    def read(self, cursor: int, limit: int = 20_000, keep: Keep | None = None) -> tuple[list[Delivery], int]:
        """At most ``limit`` points stored after ``cursor`` (the samples of those ``keep`` keeps),
        and the cursor to pass next time."""
        ...

    def head(self) -> int:
        """The id of the newest stored point (the backlog is ``head() - cursor``)."""
        ...

    def cursor(self, name: str) -> int: ...

    def save_cursor(self, name: str, position: int) -> None: ...


class LatestReader(Protocol):
    def values(
        self, node: str | None = None, source: str | None = None, fresh_since: float | None = None
    ) -> list[tuple[str, Sample]]:
        """The newest sample of each series, ordered by node, then series id."""
        ...

    def unflushed(self) -> int:
        """Series whose latest value is only in memory."""
        ...


class NodeReader(Protocol):
    def nodes(self) -> list[NodeRecord]: ...

    def node_states(self, stale_before: float) -> NodeStates: ...

    def node(self, name: str) -> NodeRecord: ...

    def series_count(self) -> int: ...


class FleetHealthReader(Protocol):
    def fleet_health(self, stale_before: float) -> FleetHealth: ...


class SeriesReader(Protocol):
    def find_series(
        self,
        node: str | None = None,
        device: str | None = None,
        port: str | None = None,
        counter: str | None = None,
        source: str | None = None,
        limit: int = 100,
    ) -> list[SeriesInfo]: ...

    def points(self, series_id: int, since: float, until: float, limit: int = 10_000) -> list[PointRecord]: ...


class IncidentSink(Protocol):
    def upsert(self, inc: Incident) -> tuple[int, str]:
        """Store the engine's view of ``inc``; returns (id, transition)."""
        ...

    def touch(self, key: str, updated_ts: float) -> bool:
        """Move an unresolved incident's ``updated_ts`` forward (the fault is still there)."""
        ...

    def unresolved(self) -> list[Incident]:
        """The incidents not resolved, as the engine keeps them (what a new engine takes over)."""
        ...


class IncidentReader(Protocol):
    def query(
        self,
        state: str | None = None,
        kind: str | None = None,
        since: float | None = None,
        limit: int = 100,
        job: str | None = None,
    ) -> list[IncidentRecord]: ...

    def get(self, incident_id: int) -> IncidentRecord: ...


class IncidentCounter(Protocol):
    def open_counts(self) -> list[IncidentCount]: ...


class IncidentActions(Protocol):
    def ack(self, incident_id: int, by: str, now: float, note: str = "") -> IncidentRecord: ...

    def resolve(self, incident_id: int, by: str, now: float, note: str = "") -> IncidentRecord: ...


class TokenLookup(Protocol):
    def find(self, token: str) -> TokenInfo | None:
        """The live (not revoked) token's record, or None."""
        ...


class TokenAdmin(Protocol):
    def create(self, role: str, now: float, node: str | None = None, note: str = "") -> tuple[int, str]: ...

    def revoke(self, id_or_token: str, now: float) -> TokenInfo: ...

    def all(self) -> list[TokenInfo]: ...

    def has_admin(self) -> bool: ...


class TopologyReader(Protocol):
    def get(self, name: str = "default") -> TopologyRecord: ...


class TopologyStore(TopologyReader, Protocol):
    def put(self, doc: dict[str, Any], now: float, name: str = "default") -> None: ...


class JobSink(Protocol):
    def record(self, reports: Sequence[JobReport]) -> None:
        """Apply what one batch said about the jobs on its node."""
        ...


class PathSink(Protocol):
    def record(self, reports: Sequence[PathReport]) -> None:
        """Apply the traces one batch reported."""
        ...


class PathReader(Protocol):
    generation: int

    def all(self) -> list[PathRecord]: ...


class JobReader(Protocol):
    def running(self) -> list[JobPlacement]: ...

    def get(self, job_id: str) -> JobPlacement: ...

    def overlapping(self, start: float, end: float) -> list[JobPlacement]: ...
