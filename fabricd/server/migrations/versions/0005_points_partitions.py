"""points: time partitions on PostgreSQL (range on ts), filled by COPY; SQLite unchanged

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 16:00:00

PostgreSQL's ``points`` becomes a table partitioned by range of ``ts`` (fabricd/server/store/
partitions.py): retention drops whole partitions, downsampling replaces a whole partition, and no
point is deleted one by one. An existing table's points are copied into the new one, ids kept
(the detection and latest-value cursors are point ids), into a partition per ``PARTITION_SECONDS``
of the last ``HISTORY_SECONDS`` that holds points; older or future ones into the default
partition, as ingest would put them. The copy runs inside the migration's transaction: a large
database is locked for its length (about 1 µs a point measured, docs/storage.md). The (step, ts)
index is not kept there (maintenance finds raw points by partition). SQLite keeps its one table:
one process, one file, no DDL-free retention to gain.
"""

from __future__ import annotations

import time

from alembic import op

from fabricd.server.store import partitions as parts

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    now = time.time()
    parts.run(conn, "ALTER TABLE points RENAME TO points_unpartitioned")
    parts.run(conn, "ALTER TABLE points_unpartitioned RENAME CONSTRAINT points_pkey TO points_unpartitioned_pkey")
    parts.run(conn, "DROP INDEX ix_points_series_ts")
    parts.run(conn, "DROP INDEX ix_points_step_ts")
    parts.run(conn, "ALTER SEQUENCE points_id_seq OWNED BY NONE")  # else dropping the old table drops it
    parts.create_parent(conn)
    width = parts.PARTITION_SECONDS
    held = conn.exec_driver_sql(
        "SELECT DISTINCT floor(ts / %(w)s) * %(w)s FROM points_unpartitioned WHERE ts >= %(a)s AND ts < %(b)s",
        {"w": width, "a": now - parts.HISTORY_SECONDS, "b": parts.aligned(now) + (parts.AHEAD + 1) * width},
    )
    for (start,) in held:
        parts.create(conn, float(start), float(start) + width)
    parts.run(conn, "INSERT INTO points SELECT * FROM points_unpartitioned")
    parts.run(conn, "DROP TABLE points_unpartitioned")
    parts.ensure(conn, now)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    parts.run(conn, "ALTER SEQUENCE points_id_seq OWNED BY NONE")
    parts.run(conn, "ALTER TABLE points RENAME TO points_partitioned")
    parts.run(conn, "ALTER TABLE points_partitioned RENAME CONSTRAINT points_pkey TO points_partitioned_pkey")
    parts.run(conn, "ALTER INDEX ix_points_series_ts RENAME TO ix_points_series_ts_partitioned")
    parts.run(
        conn,
        "CREATE TABLE points (id BIGINT NOT NULL DEFAULT nextval('points_id_seq') PRIMARY KEY, "
        "series_id BIGINT NOT NULL, ts FLOAT8 NOT NULL, value FLOAT8 NOT NULL, rate FLOAT8, "
        "status VARCHAR(16) NOT NULL, since FLOAT8, step FLOAT8 NOT NULL)",
    )
    parts.run(conn, "INSERT INTO points SELECT * FROM points_partitioned")
    parts.run(conn, "DROP TABLE points_partitioned CASCADE")
    parts.run(conn, "ALTER SEQUENCE points_id_seq OWNED BY points.id")
    parts.run(conn, "CREATE INDEX ix_points_series_ts ON points (series_id, ts)")
    parts.run(conn, "CREATE INDEX ix_points_step_ts ON points (step, ts)")
