"""PostgreSQL's raw and folded points in time partitions: created ahead, folded whole, dropped whole.

Two tables are range-partitioned on event time in partitions ``PARTITION_SECONDS`` wide: the raw
chunks, ``point_chunks`` on ``ts_min`` (a batch's earliest point; ``chunks.py``, migration 0011),
and the folded points, ``points`` on ``ts``. Partitions are named ``<table>_p<start>``, plus
``<table>_default`` for rows outside every partition (an agent with a wrong clock, a backlog older
than the partitions): nothing is ever refused for its time. A time range lives three stages, none
of which deletes rows one by one:

1. raw: ingest appends chunks to its ``point_chunks`` partition; created ``AHEAD`` partitions early;
2. folded: once it lies wholly before the raw cutoff, its chunks are folded into ``step``-wide
   buckets, rows of ``points``, and the chunk partition is dropped (``chunk_fold.py``);
3. gone: once it lies wholly before the retention, its ``points`` partition is dropped.

Folded points keep the id of their bucket's newest raw point: ids stay unique, take nothing from
the id sequence (ingest's batches keep consecutive ids, which the stream's tail relies on), and
stay below the stream's cursor. Choice and numbers: docs/storage.md, "Time partitions".
https://www.postgresql.org/docs/15/ddl-partitioning.html
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

PARTITION_SECONDS = 6 * 3600.0  # docs/storage.md: the raw retention's default, measured against 1 h and 1 d
AHEAD = 2  # partitions created past the current one: 12 h of slack for a maintenance loop every 5 min
HISTORY_SECONDS = 60 * 86400.0  # a migration partitions existing points this far back; older ones go to default
DEFAULT = "points_default"
CHUNKS_DEFAULT = "point_chunks_default"
# The parent; ``{name}`` also names the pre-partitioning copy during the migration.
_COLUMNS = (
    "id BIGINT NOT NULL DEFAULT nextval('points_id_seq'), series_id BIGINT NOT NULL, ts FLOAT8 NOT NULL, "
    "value FLOAT8 NOT NULL, rate FLOAT8, status VARCHAR(16) NOT NULL, since FLOAT8, step FLOAT8 NOT NULL DEFAULT 0"
)
_BOUND = re.compile(r"FOR VALUES FROM \('?([^')]+)'?\) TO \('?([^')]+)'?\)")


@dataclass(frozen=True, slots=True)
class Parent:
    """A partitioned table and the column it is partitioned on."""

    table: str
    key: str

    @property
    def default(self) -> str:
        return f"{self.table}_default"


POINTS = Parent("points", "ts")
CHUNKS = Parent("point_chunks", "ts_min")


@dataclass(frozen=True, slots=True, order=True)
class Partition:
    start: float
    end: float
    name: str


def name_of(start: float, parent: Parent = POINTS) -> str:
    return f"{parent.table}_p{int(start)}"


def aligned(ts: float, width: float = PARTITION_SECONDS) -> float:
    return ts // width * width


def create_parent(conn: Connection) -> None:
    """The partitioned ``points`` (and its default partition), with no time partition yet.

    The primary key must hold the partition key, hence (id, ts). No (step, ts) index: maintenance
    finds raw points by partition, and one index fewer per point is a third of COPY's server
    cost (docs/storage.md)."""
    run(conn, f"CREATE TABLE points ({_COLUMNS}, CONSTRAINT points_pkey PRIMARY KEY (id, ts)) PARTITION BY RANGE (ts)")
    run(conn, "CREATE INDEX ix_points_series_ts ON points (series_id, ts)")
    run(conn, "ALTER SEQUENCE points_id_seq OWNED BY points.id")
    run(conn, f"CREATE TABLE {DEFAULT} PARTITION OF points DEFAULT")


def create_chunks_parent(conn: Connection) -> None:
    """The partitioned ``point_chunks`` (and its default partition): a chunk's ``id`` is its last
    point's; (node, id) serves the correlator's partition reads, (node, ts_min) a series' history.

    The blob is compressed by lz4 where the server has it: TOAST's default pglz cost more server
    CPU a point than the rows it replaces (2.0-2.9 µs against 0.6 for lz4, docs/storage.md); a
    server built without lz4 stores it uncompressed out of line (``EXTERNAL``, 0.4-0.8 µs)."""
    run(
        conn,
        "CREATE TABLE point_chunks (id BIGINT NOT NULL, count INT NOT NULL, node TEXT NOT NULL, "
        "ts_min FLOAT8 NOT NULL, ts_max FLOAT8 NOT NULL, points BYTEA NOT NULL, ids BYTEA, "
        "CONSTRAINT point_chunks_pkey PRIMARY KEY (id, ts_min)) PARTITION BY RANGE (ts_min)",
    )
    try:
        with conn.begin_nested():
            run(conn, "ALTER TABLE point_chunks ALTER COLUMN points SET COMPRESSION lz4")
    except DBAPIError:  # "compression method lz4 not supported": a server built without it
        run(conn, "ALTER TABLE point_chunks ALTER COLUMN points SET STORAGE EXTERNAL")
    run(conn, "CREATE INDEX ix_point_chunks_node_id ON point_chunks (node, id)")
    run(conn, "CREATE INDEX ix_point_chunks_node_ts ON point_chunks (node, ts_min)")
    run(conn, f"CREATE TABLE {CHUNKS_DEFAULT} PARTITION OF point_chunks DEFAULT")


def exists(conn: Connection, parent: Parent) -> bool:
    return conn.exec_driver_sql("SELECT to_regclass(%(t)s)", {"t": parent.table}).scalar() is not None


def partitions(conn: Connection, parent: Parent = POINTS) -> list[Partition]:
    """The time partitions, oldest first (the default partition is not one)."""
    rows = conn.exec_driver_sql(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %(t)s::regclass",
        {"t": parent.table},
    ).all()
    found = []
    for name, bound in rows:
        m = _BOUND.match(bound)
        if m is not None:
            found.append(Partition(float(m.group(1)), float(m.group(2)), name))
    return sorted(found)


def is_partitioned(conn: Connection) -> bool:
    kind = conn.exec_driver_sql("SELECT relkind FROM pg_class WHERE oid = 'points'::regclass").scalar()
    return kind == "p"


def ensure(conn: Connection, now: float, width: float = PARTITION_SECONDS) -> list[Partition]:
    """For each partitioned table, create the partition holding ``now`` and ``AHEAD`` after it,
    and one for every stray in the default partition from ``HISTORY_SECONDS`` back to the last of
    those (its rows move in). Returns the partitions created."""
    serialize(conn)
    first, last = aligned(now, width), aligned(now, width) + AHEAD * width
    created = []
    for parent in (POINTS, CHUNKS):
        if not exists(conn, parent):  # migrations before 0011 have no chunks
            continue
        starts = {first + k * width for k in range(AHEAD + 1)}
        starts |= strays(conn, now - HISTORY_SECONDS, last + width, width, parent)
        have = partitions(conn, parent)
        for start in sorted(starts):
            if not any(p.start < start + width and start < p.end for p in have):  # overlaps none
                created.append(create(conn, start, start + width, parent))
    return created


def strays(conn: Connection, since: float, until: float, width: float, parent: Parent = POINTS) -> set[float]:
    """Partition starts for the default partition's rows in [since, until)."""
    key = parent.key
    rows = conn.exec_driver_sql(
        f"SELECT DISTINCT floor({key} / %(w)s) * %(w)s FROM {parent.default} WHERE {key} >= %(a)s AND {key} < %(b)s",
        {"w": width, "a": since, "b": until},
    )
    return {float(start) for (start,) in rows}


def create(conn: Connection, start: float, end: float, parent: Parent = POINTS) -> Partition:
    """A partition for [start, end); rows of that time waiting in the default partition move in.

    Built beside the parent and attached, so the parent is locked only for the attach; the default
    partition is locked first so no row of the range lands there in between (PostgreSQL refuses
    the attach if one does)."""
    name, key = name_of(start, parent), parent.key
    run(conn, f"LOCK TABLE {parent.default} IN ACCESS EXCLUSIVE MODE")
    like = "INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMPRESSION INCLUDING STORAGE"
    run(conn, f"CREATE TABLE {name} (LIKE {parent.table} {like})")
    moving = f"DELETE FROM {parent.default} WHERE {key} >= %(a)s AND {key} < %(b)s RETURNING *"
    conn.exec_driver_sql(f"WITH m AS ({moving}) INSERT INTO {name} SELECT * FROM m", {"a": start, "b": end})
    bound(conn, parent, name, start, end)
    attach(conn, parent, name, name, start, end)
    return Partition(start, end, name)


def drop_before(conn: Connection, before: float) -> tuple[list[Partition], int]:
    """Drop every partition of either table that ends at or before ``before``; (dropped, their
    point count).

    The count comes from the planner's statistics (``reltuples``, times a chunk's points on
    average): counting rows would read the whole partition this is built to avoid reading."""
    serialize(conn)
    gone, points = [], 0
    for parent in (POINTS, CHUNKS):
        if not exists(conn, parent):
            continue
        for p in [p for p in partitions(conn, parent) if p.end <= before]:
            points += _estimate(conn, parent, p.name)
            run(conn, f"DROP TABLE {p.name}")
            gone.append(p)
    return gone, points


def _estimate(conn: Connection, parent: Parent, table: str) -> int:
    rows = conn.exec_driver_sql("SELECT reltuples FROM pg_class WHERE oid = %(n)s::regclass", {"n": table}).scalar()
    rows = max(0, int(rows or 0))
    if parent is CHUNKS and rows:
        rows *= int(
            conn.exec_driver_sql(
                f"SELECT coalesce(avg(count), 0) FROM (SELECT count FROM {table} LIMIT 100) c"
            ).scalar()
            or 0
        )
    return rows


def bound(conn: Connection, parent: Parent, table: str, start: float, end: float) -> None:
    """A CHECK constraint equal to the bound lets the attach skip scanning the table under the
    parent's lock (https://www.postgresql.org/docs/15/sql-altertable.html, ATTACH PARTITION)."""
    key = parent.key
    run(conn, f"ALTER TABLE {table} ADD CONSTRAINT {table}_bound CHECK ({key} >= {start!r} AND {key} < {end!r})")


def attach(conn: Connection, parent: Parent, name: str, bound_of: str, start: float, end: float) -> None:
    run(conn, f"ALTER TABLE {parent.table} ATTACH PARTITION {name} FOR VALUES FROM ({start!r}) TO ({end!r})")
    run(conn, f"ALTER TABLE {name} DROP CONSTRAINT {bound_of}_bound")


def serialize(conn: Connection) -> None:
    """One partition change at a time across every process on the database (replicas each run
    maintenance), until this transaction ends; the caller then reads the partitions afresh."""
    run(conn, "SELECT pg_advisory_xact_lock(hashtext('fabricd.points.partitions'))")


def run(conn: Connection, sql: str) -> None:
    conn.exec_driver_sql(sql)
