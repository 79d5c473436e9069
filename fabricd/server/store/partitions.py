"""PostgreSQL's points in time partitions: created ahead, folded whole, dropped whole.

``points`` is range-partitioned on ``ts`` (event time) in partitions ``PARTITION_SECONDS`` wide,
named ``points_p<start>``, plus ``points_default`` for points outside every partition (an agent
with a wrong clock, a backlog older than the partitions): nothing is ever refused for its time.
Each partition lives three stages, none of which deletes rows one by one:

1. raw: ingest appends to it (``COPY``, ``postgres.py``); created ``AHEAD`` partitions early;
2. folded: once it lies wholly before the raw cutoff, its raw points are folded into
   ``step``-wide buckets in a new table, which replaces it (detach, drop, attach);
3. gone: once it lies wholly before the retention, it is dropped.

Folded points keep the id of their bucket's newest raw point: ids stay unique, take nothing from
the id sequence (ingest's batches keep consecutive ids, which the stream's tail relies on), and
stay below the stream's cursor. Choice and numbers: docs/storage.md, "Time partitions".
https://www.postgresql.org/docs/15/ddl-partitioning.html
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import Connection

PARTITION_SECONDS = 6 * 3600.0  # docs/storage.md: the raw retention's default, measured against 1 h and 1 d
AHEAD = 2  # partitions created past the current one: 12 h of slack for a maintenance loop every 5 min
HISTORY_SECONDS = 60 * 86400.0  # a migration partitions existing points this far back; older ones go to default
DEFAULT = "points_default"
# The parent; ``{name}`` also names the pre-partitioning copy during the migration.
_COLUMNS = (
    "id BIGINT NOT NULL DEFAULT nextval('points_id_seq'), series_id BIGINT NOT NULL, ts FLOAT8 NOT NULL, "
    "value FLOAT8 NOT NULL, rate FLOAT8, status VARCHAR(16) NOT NULL, since FLOAT8, step FLOAT8 NOT NULL DEFAULT 0"
)
_BOUND = re.compile(r"FOR VALUES FROM \('?([^')]+)'?\) TO \('?([^')]+)'?\)")


@dataclass(frozen=True, slots=True, order=True)
class Partition:
    start: float
    end: float
    name: str


def name_of(start: float) -> str:
    return f"points_p{int(start)}"


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


def partitions(conn: Connection) -> list[Partition]:
    """The time partitions, oldest first (the default partition is not one)."""
    rows = conn.exec_driver_sql(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'points'::regclass"
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
    """Create the partition holding ``now`` and ``AHEAD`` after it, and one for every stray in the
    default partition from ``HISTORY_SECONDS`` back to the last of those (its rows move in).
    Returns the partitions created."""
    serialize(conn)
    first, last = aligned(now, width), aligned(now, width) + AHEAD * width
    starts = {first + k * width for k in range(AHEAD + 1)}
    starts |= strays(conn, now - HISTORY_SECONDS, last + width, width)
    have = partitions(conn)
    created = []
    for start in sorted(starts):
        if not any(p.start < start + width and start < p.end for p in have):  # overlaps none
            created.append(create(conn, start, start + width))
    return created


def strays(conn: Connection, since: float, until: float, width: float) -> set[float]:
    """Partition starts for the default partition's points in [since, until)."""
    rows = conn.exec_driver_sql(
        f"SELECT DISTINCT floor(ts / %(w)s) * %(w)s FROM {DEFAULT} WHERE ts >= %(a)s AND ts < %(b)s",
        {"w": width, "a": since, "b": until},
    )
    return {float(start) for (start,) in rows}


def create(conn: Connection, start: float, end: float) -> Partition:
    """A partition for [start, end); points of that time waiting in the default partition move in.

    Built beside the parent and attached, so the parent is locked only for the attach; the default
    partition is locked first so no point of the range lands there in between (PostgreSQL refuses
    the attach if one does)."""
    name = name_of(start)
    run(conn, f"LOCK TABLE {DEFAULT} IN ACCESS EXCLUSIVE MODE")
    run(conn, f"CREATE TABLE {name} (LIKE points INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    moving = f"DELETE FROM {DEFAULT} WHERE ts >= %(a)s AND ts < %(b)s RETURNING *"
    conn.exec_driver_sql(f"WITH m AS ({moving}) INSERT INTO {name} SELECT * FROM m", {"a": start, "b": end})
    _bound(conn, name, start, end)
    _attach(conn, name, name, start, end)
    return Partition(start, end, name)


def drop_before(conn: Connection, before: float) -> tuple[list[Partition], int]:
    """Drop every partition that ends at or before ``before``; (dropped, their point count).

    The count comes from the planner's statistics (``reltuples``): counting rows would read the
    whole partition this is built to avoid reading."""
    serialize(conn)
    gone = [p for p in partitions(conn) if p.end <= before]
    points = 0
    for p in gone:
        estimate = conn.exec_driver_sql(
            "SELECT reltuples FROM pg_class WHERE oid = %(n)s::regclass", {"n": p.name}
        ).scalar()
        points += max(0, int(estimate or 0))
        run(conn, f"DROP TABLE {p.name}")
    return gone, points


# The SQLite path's fold (maintenance.downsample) in one statement: per series and bucket, the bucket's
# start (clamped into the partition), the newest value of a counter or the mean of a gauge, the mean
# of the honest rates, "ok" when there were rates or else the newest status.
_FOLD = (
    "INSERT INTO {new} (id, series_id, ts, value, rate, status, since, step) "
    "SELECT max(p.id), p.series_id, greatest(floor(p.ts / %(step)s) * %(step)s, %(start)s) AS bucket, "
    "CASE WHEN s.kind = 'counter' THEN (array_agg(p.value ORDER BY p.ts DESC, p.id DESC))[1] "
    "ELSE avg(p.value) END, avg(p.rate), "
    "CASE WHEN count(p.rate) > 0 THEN 'ok' ELSE (array_agg(p.status ORDER BY p.ts DESC, p.id DESC))[1] END, "
    "NULL, %(step)s FROM {old} p JOIN series s ON s.id = p.series_id WHERE p.step = 0 AND p.id <= %(hi)s "
    "GROUP BY p.series_id, bucket, s.kind"
)


def fold(conn: Connection, p: Partition, step: float) -> tuple[int, int]:
    """Replace partition ``p`` by its raw points folded into ``step`` buckets plus its earlier
    folded points; (raw points folded, buckets written). A partition with no raw point is left.

    The fold reads the points up to the partition's newest id without locking ingest out. Then
    the parent is locked (ingest waits, for milliseconds), points stored meanwhile (a backlog
    hours late) move over raw, for the next fold, and the new table takes the old one's place.
    Locking the partition for the whole fold instead would deadlock with a writer routing a
    late point there while holding the parent."""
    serialize(conn)
    if conn.exec_driver_sql("SELECT to_regclass(%(n)s)", {"n": p.name}).scalar() is None:
        return 0, 0  # dropped meanwhile by another replica's maintenance
    hi, raw = conn.exec_driver_sql(f"SELECT max(id), count(*) FILTER (WHERE step = 0) FROM {p.name}").one()
    if not raw:
        return 0, 0
    new = f"{p.name}_folded"
    # Indexes and the bound's CHECK built here, before the parent is locked: the attach then
    # neither builds an index nor scans the table.
    run(conn, f"CREATE TABLE {new} (LIKE points INCLUDING ALL)")
    conn.exec_driver_sql(f"INSERT INTO {new} SELECT * FROM {p.name} WHERE step <> 0 AND id <= %(hi)s", {"hi": hi})
    fold = _FOLD.format(new=new, old=p.name)
    written = conn.exec_driver_sql(fold, {"step": step, "start": p.start, "hi": hi}).rowcount
    _bound(conn, new, p.start, p.end)
    run(conn, "LOCK TABLE points IN ACCESS EXCLUSIVE MODE")
    conn.exec_driver_sql(f"INSERT INTO {new} SELECT * FROM {p.name} WHERE id > %(hi)s", {"hi": hi})
    run(conn, f"DROP TABLE {p.name}")
    run(conn, f"ALTER TABLE {new} RENAME TO {p.name}")
    _attach(conn, p.name, new, p.start, p.end)
    return int(raw), int(written or 0)


def _bound(conn: Connection, table: str, start: float, end: float) -> None:
    # A CHECK constraint equal to the bound lets the attach skip scanning the table under the
    # parent's lock (https://www.postgresql.org/docs/15/sql-altertable.html, ATTACH PARTITION).
    run(conn, f"ALTER TABLE {table} ADD CONSTRAINT {table}_bound CHECK (ts >= {start!r} AND ts < {end!r})")


def _attach(conn: Connection, name: str, bound_of: str, start: float, end: float) -> None:
    run(conn, f"ALTER TABLE points ATTACH PARTITION {name} FOR VALUES FROM ({start!r}) TO ({end!r})")
    run(conn, f"ALTER TABLE {name} DROP CONSTRAINT {bound_of}_bound")


def serialize(conn: Connection) -> None:
    """One partition change at a time across every process on the database (replicas each run
    maintenance), until this transaction ends; the caller then reads the partitions afresh."""
    run(conn, "SELECT pg_advisory_xact_lock(hashtext('fabricd.points.partitions'))")


def run(conn: Connection, sql: str) -> None:
    conn.exec_driver_sql(sql)
