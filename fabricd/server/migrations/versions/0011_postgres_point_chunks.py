"""PostgreSQL: raw points in chunks, one row per stored batch, in time partitions (point_chunks)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 18:30:00

A row per raw point cost the PostgreSQL server 5.2 µs of CPU a point (heap tuple, two B-tree
entries, their WAL), as much as the whole central; a chunk a batch, its blob compressed by lz4,
costs 0.6 (docs/storage.md, "PostgreSQL's share of a sample"). ``point_chunks`` is range-partitioned
on ``ts_min`` with the same partitions as ``points`` (fabricd/server/store/partitions.py), which
keeps the folded points. ``fabricd_point_ids(n)`` gives a chunk its ``n`` consecutive point ids
from ``points_id_seq`` (fabricd/server/store/postgres.py).

The raw rows stored so far move into chunks with their ids (the detection and latest-value
cursors are point ids): runs of consecutive ids of one node in one time partition, at most
``CHUNK_POINTS`` a chunk, as SQLite's migration 0008 did; then they are deleted from ``points``,
which from here takes folded points only (``CHECK (step > 0)``). This runs inside the
migration's transaction, read through a server-side cursor: a large database is locked for its
length. Every replica must run a release with this migration (docs/operations.md, "Upgrades"):
an older one's raw rows are refused.
"""

from __future__ import annotations

import time
from typing import Any

from alembic import op

from fabricd.server.store import chunks
from fabricd.server.store import partitions as parts

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# A replica on a release before this one stores raw points as rows of ``points`` (``step`` 0), which
# no reader here looks at: the constraint refuses them, so its batches fail and stay with their
# agents (spool) or on the bus until a replica of this release stores them.
FOLDED_ONLY = "points_folded_only"
CHUNK_POINTS = 1000  # a batch holds at most 1,000 samples (the wire's limit)
_RAW = (
    "SELECT p.id, coalesce(s.node, ''), p.series_id, p.ts, p.value, p.rate, p.status, p.since FROM points p "
    "LEFT JOIN series s ON s.id = p.series_id WHERE p.step = 0.0 ORDER BY p.id"
)
_INSERT = f"INSERT INTO {chunks.TABLE} (id, count, node, ts_min, ts_max, points) VALUES (%s, %s, %s, %s, %s, %b)"

# Taken and moved on under a session advisory lock (not held to commit: replicas' ingest would then
# commit one at a time), released on error too: nextval and setval are two calls, and another
# session's nextval between them would take an id of this block.
_POINT_IDS = """
CREATE FUNCTION fabricd_point_ids(n bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    first bigint;
BEGIN
    PERFORM pg_advisory_lock(hashtext('fabricd.points.ids'));
    BEGIN
        first := nextval('points_id_seq');
        IF n > 1 THEN
            PERFORM setval('points_id_seq', first + n - 1);
        END IF;
    EXCEPTION WHEN OTHERS THEN
        PERFORM pg_advisory_unlock(hashtext('fabricd.points.ids'));
        RAISE;
    END;
    PERFORM pg_advisory_unlock(hashtext('fabricd.points.ids'));
    RETURN first + n - 1;
END
$$
"""


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    parts.create_chunks_parent(conn)
    for p in parts.partitions(conn, parts.POINTS):
        parts.create(conn, p.start, p.end, parts.CHUNKS)
    conn.exec_driver_sql(_POINT_IDS)
    driver = conn.connection.driver_connection
    assert driver is not None
    write = driver.cursor()
    run: list[tuple[Any, ...]] = []
    with driver.cursor(name="fabricd_0011_raw") as raw:  # server-side: never every point in memory
        raw.execute(_RAW)
        for row in raw:
            if run and (_key(row) != _key(run[-1]) or row[0] != run[-1][0] + 1 or len(run) == CHUNK_POINTS):
                _write(write, run)
                run = []
            run.append(row)
    if run:
        _write(write, run)
    conn.exec_driver_sql("DELETE FROM points WHERE step = 0.0")
    conn.exec_driver_sql(f"ALTER TABLE points ADD CONSTRAINT {FOLDED_ONLY} CHECK (step > 0)")
    parts.ensure(conn, time.time())


def _key(row: tuple[Any, ...]) -> tuple[str, float]:
    """A chunk holds one node's points of one time partition (``ChunkSQL.write``)."""
    return row[1], parts.aligned(row[3])


def _write(cur: Any, run: list[tuple[Any, ...]]) -> None:
    blob, ts_min, ts_max = chunks.pack([r[2:] for r in run])
    cur.execute(_INSERT, (run[-1][0], len(run), run[0][1], ts_min, ts_max, blob))


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    driver = conn.connection.driver_connection
    assert driver is not None
    conn.exec_driver_sql(f"ALTER TABLE points DROP CONSTRAINT {FOLDED_ONLY}")
    cur = driver.cursor()
    with driver.cursor(name="fabricd_0011_chunks") as found:
        found.execute(f"SELECT id, count, points, ids FROM {chunks.TABLE} ORDER BY id")
        for last_id, count, blob, ids in found:
            points = chunks.unpack(last_id, count, bytes(blob), ids and bytes(ids))
            with cur.copy("COPY points (id, series_id, ts, value, rate, status, since) FROM STDIN") as copy:
                for p in points:
                    copy.write_row(p)
    conn.exec_driver_sql(f"DROP TABLE {chunks.TABLE}")
    conn.exec_driver_sql("DROP FUNCTION fabricd_point_ids(bigint)")
