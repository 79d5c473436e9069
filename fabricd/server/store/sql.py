"""What the raw-DBAPI roles share: the engine, the one write lock, and the dialect's statements.

Ingest, the sample stream and the latest values run on the driver's own cursor with SQL written
once per placeholder style (``?`` sqlite3, ``%s`` psycopg): SQLAlchemy's per-statement compile and
per-row parameter processing cost more than SQLite's own work at these rates (docs/storage.md).
The text common to both databases is built here; what differs (bulk statements, the last generated
id, an id list) comes from ``sqlite.py`` and ``postgres.py``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Engine

if TYPE_CHECKING:
    from fabricd.server.store.chunk_reads import ChunkSQL

LATEST_CURSOR = "latest"  # cursors row: every raw point up to here has its latest value in the table
# The durable copy of the latest values: a row per node, its series' newest points packed as a chunk
# (``chunks.pack``), written by ``LatestValues.flush`` (store/latest.py, migration 0009).
LATEST_TABLE = "latest_chunks"
LATEST_ROWS = f"SELECT node, count, points FROM {LATEST_TABLE}"


# A batch's points as columns: series ids, times, values, rates, statuses, since times.
PointColumns = tuple[Sequence[int], Sequence[float], Sequence[float], Sequence[Any], Sequence[str], Sequence[Any]]


class SeriesWriter(Protocol):
    """Inserts a node's new series on a DBAPI cursor, ``rows`` the columns of ``SERIES_COLUMNS``;
    the id each row was stored with, in the rows' order, None for a row another writer (a replica)
    stored first, which is kept as it is."""

    def run(self, cur: Any, rows: Sequence[tuple[Any, ...]]) -> list[int | None]: ...


@dataclass(frozen=True, slots=True)
class Statements:
    """Every raw statement of ingest, the stream and the latest values, in one dialect.

    ``ON CONFLICT`` (SQLite >= 3.24, PostgreSQL >= 9.5) makes the batch-id check, the node and the
    collector health one statement each; the unique (node, batch id) makes a retried batch a no-op.
    ``UPDATE .. FROM`` needs SQLite >= 3.33, ``RETURNING`` 3.35.
    """

    claim_batch: str
    upsert_node: str
    # Both in one statement where the dialect can (PostgreSQL: a data-modifying CTE); rowcount 0 is
    # a retried batch. Each statement costs the client ~40 µs of CPU on psycopg: a tenth of a batch.
    claim_and_upsert_node: str | None
    node_last_point: str  # records the batch's last point id on its node and returns it
    upsert_health: str
    insert_series: SeriesWriter  # one statement for a node's new series (its first scrape: 480 rows)
    node_series: str
    # Raw points are chunks, one row per batch (``chunks.py``): written and read through these.
    chunks: ChunkSQL
    max_point_id: str
    series_identity: Callable[[list[int]], tuple[str, Sequence[Any]]]  # ids -> (sql, parameters)
    read_cursor: str
    upsert_cursor: str
    # (nodes or None for all, lock for a merge) -> (sql, parameters): the nodes' packed latest values
    latest_of: Callable[[Sequence[str] | None, bool], tuple[str, Sequence[Any]]]
    write_latest: str
    table_latest: str  # the series rows' latest_* columns, written by releases before migration 0009
    # SQLite has one writer: a write beside ingest (latest values, a reader's cursor) takes the write
    # lock; PostgreSQL runs it beside ingest.
    serial_writes: bool
    mark: str = "?"  # the driver's placeholder, for the few statements built per call


def statements(
    m: str,
    *,
    chunks: ChunkSQL,
    max_point_id: str,
    insert_series: SeriesWriter,
    latest_of: Callable[[Sequence[str] | None, bool], tuple[str, Sequence[Any]]],
    last_point_id: str,
    claim_and_upsert_node: str | None,
    series_identity: Callable[[list[int]], tuple[str, Sequence[Any]]],
    serial_writes: bool,
) -> Statements:
    """The common statement texts with placeholder ``m``, plus the dialect's own parts."""

    def marks(n: int) -> str:
        return ", ".join([m] * n)

    return Statements(
        claim_batch=CLAIM_BATCH.format(m=m),
        upsert_node=UPSERT_NODE.format(rows=f"VALUES ({marks(5)}, 1, {m})"),
        claim_and_upsert_node=claim_and_upsert_node,
        # ``last_point_id``: this connection's last generated id, where the batch's points end.
        node_last_point=f"UPDATE nodes SET last_point_id = {last_point_id} WHERE name = {m} RETURNING last_point_id",
        upsert_health="INSERT INTO collector_status (node, collector, success, duration_seconds, ts, error, "
        f"readings) VALUES ({marks(7)}) ON CONFLICT (node, collector) DO UPDATE SET "
        "success = excluded.success, duration_seconds = excluded.duration_seconds, ts = excluded.ts, "
        "error = excluded.error, readings = excluded.readings",
        insert_series=insert_series,
        node_series=f"SELECT id, source, device, port, counter, labels FROM series WHERE node = {m}",
        chunks=chunks,
        max_point_id=max_point_id,
        series_identity=series_identity,
        read_cursor=f"SELECT position FROM cursors WHERE name = {m}",
        upsert_cursor=f"INSERT INTO cursors (name, position) VALUES ({m}, {m}) "
        "ON CONFLICT (name) DO UPDATE SET position = excluded.position",
        latest_of=latest_of,
        write_latest=f"INSERT INTO {LATEST_TABLE} (node, count, points) VALUES ({marks(3)}) "
        "ON CONFLICT (node) DO UPDATE SET count = excluded.count, points = excluded.points",
        table_latest="SELECT node, id, latest_ts, latest_value, latest_rate, latest_status, latest_since "
        "FROM series WHERE latest_ts IS NOT NULL AND latest_value IS NOT NULL",
        serial_writes=serial_writes,
        mark=m,
    )


# The unique (node, batch id) makes a retried batch a no-op; the node row counts the batch. ``rows``:
# (name, agent_version, first_seen, last_seen, last_batch_ts, 1, samples).
CLAIM_BATCH = (
    "INSERT INTO ingested_batches (node, batch_id, received_ts, samples) VALUES ({m}, {m}, {m}, {m}) "
    "ON CONFLICT (node, batch_id) DO NOTHING"
)
UPSERT_NODE = (
    "INSERT INTO nodes (name, agent_version, first_seen, last_seen, last_batch_ts, batches, samples) {rows} "
    "ON CONFLICT (name) DO UPDATE SET agent_version = excluded.agent_version, last_seen = excluded.last_seen, "
    "last_batch_ts = excluded.last_batch_ts, batches = nodes.batches + 1, samples = nodes.samples + excluded.samples"
)

# A node's new series; a series another replica added meanwhile is kept as it is.
SERIES_COLUMNS = "node, source, device, port, counter, labels, name, unit, kind"
# A series another replica created meanwhile is kept; the new series' ids come back with their keys
# (a multi-row RETURNING's order is unspecified), and the writer reads the node's series back when
# fewer came back than it inserted. SQLite numbers them in the writer instead (``sqlite.NumberedSeries``).
SERIES_CONFLICT = "ON CONFLICT (node, source, device, port, counter, labels) DO NOTHING"
SERIES_RETURNING = "RETURNING id, source, device, port, counter, labels"


def statements_for(dialect: str) -> Statements:
    if dialect == "sqlite":
        from fabricd.server.store import sqlite

        return sqlite.STATEMENTS
    if dialect == "postgresql":
        from fabricd.server.store import postgres

        return postgres.STATEMENTS
    raise ValueError(
        f"fabricd stores its data in SQLite or PostgreSQL, not {dialect!r}: use a sqlite:// or "
        "postgresql+psycopg:// database URL"
    )


@dataclass(frozen=True)
class Database:
    """The engine, the dialect's statements and the one write lock, shared by every role.

    Writes are serialized by the lock so SQLite never sees two writers (which would fail with
    "database is locked" instead of queueing) and so ``points.id`` order is commit order on every
    backend: the stream's cursor can then never skip a point committed late with a smaller id.
    """

    engine: Engine
    sql: Statements
    write_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def of(cls, engine: Engine) -> Database:
        return cls(engine, statements_for(engine.dialect.name))

    @contextlib.contextmanager
    def cursor(self, transaction: bool = False) -> Iterator[Any]:
        """A raw DBAPI cursor; with ``transaction`` inside one transaction, committed on exit."""
        with self.engine.begin() if transaction else self.engine.connect() as conn:
            cur = conn.connection.cursor()
            try:
                yield cur
            finally:
                cur.close()

    def side_write_lock(self) -> contextlib.AbstractContextManager[Any]:
        """What a write beside ingest (latest values, a reader's cursor) holds: the write lock where
        the database has one writer (SQLite), nothing where it runs beside ingest (PostgreSQL)."""
        return self.write_lock if self.sql.serial_writes else contextlib.nullcontext()

    def max_point_id(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.exec_driver_sql(self.sql.max_point_id).scalar() or 0)
