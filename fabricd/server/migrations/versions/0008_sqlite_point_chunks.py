"""SQLite: raw points in chunks, one row per stored batch (fabricd/server/store/chunks.py)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 12:00:00

A row per point cost SQLite three B-tree entries a point; a chunk costs one per batch
(docs/storage.md, "Raw points in chunks"). The raw points stored so far move into chunks with their
ids (the detection and latest-value cursors are point ids): consecutive ids of one node, at most
``CHUNK_POINTS`` a chunk. Folded points (``step > 0``) stay rows of ``points``. ``AUTOINCREMENT``
keeps the highest id ever given in ``sqlite_sequence``, so ids never go back when maintenance has
deleted the newest chunks; it starts above every id of ``points``. PostgreSQL is unchanged: a row
per point in time partitions.
"""

from __future__ import annotations

from typing import Any

from alembic import op

from fabricd.server.store import chunks

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

CHUNK_POINTS = 1000  # a batch holds at most 1,000 samples (the wire's limit)
_RAW = (
    "SELECT p.id, coalesce(s.node, ''), p.series_id, p.ts, p.value, p.rate, p.status, p.since FROM points p "
    "LEFT JOIN series s ON s.id = p.series_id WHERE p.step = 0.0 ORDER BY p.id"
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.execute(
        f"CREATE TABLE {chunks.TABLE} (id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, count INTEGER NOT NULL, "
        "node TEXT NOT NULL, ts_min FLOAT NOT NULL, ts_max FLOAT NOT NULL, points BLOB NOT NULL, ids BLOB)"
    )
    op.execute(f"CREATE INDEX ix_point_chunks_node_ts ON {chunks.TABLE} (node, ts_min, ts_max)")
    op.execute(f"CREATE INDEX ix_point_chunks_ts ON {chunks.TABLE} (ts_min, node)")
    cur, raw = _cursor(), _cursor()
    top = cur.execute("SELECT coalesce(max(id), 0) FROM points").fetchone()[0]
    run: list[tuple[Any, ...]] = []
    for row in raw.execute(_RAW):  # stepped lazily: a large database's points are never all in memory
        if run and (row[1] != run[-1][1] or row[0] != run[-1][0] + 1 or len(run) == CHUNK_POINTS):
            _write(cur, run)
            run = []
        run.append(row)
    if run:
        _write(cur, run)
    cur.execute("DELETE FROM points WHERE step = 0.0")
    cur.execute(
        "INSERT INTO sqlite_sequence (name, seq) SELECT ?, ? WHERE NOT EXISTS "
        "(SELECT 1 FROM sqlite_sequence WHERE name = ?)",
        (chunks.TABLE, top, chunks.TABLE),
    )
    cur.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", (top, chunks.TABLE))


def _cursor() -> Any:
    """The migration's own sqlite3 connection's cursor (in its transaction): packing needs Python."""
    driver = op.get_bind().connection.driver_connection
    assert driver is not None
    return driver.cursor()


def _write(cur: Any, run: list[tuple[Any, ...]]) -> None:
    blob, ts_min, ts_max = chunks.pack([r[2:] for r in run])
    cur.execute(
        f"INSERT INTO {chunks.TABLE} (id, count, node, ts_min, ts_max, points) VALUES (?, ?, ?, ?, ?, ?)",
        (run[-1][0], len(run), run[0][1], ts_min, ts_max, blob),
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    cur = _cursor()
    for last_id, count, blob, ids in _cursor().execute(
        f"SELECT id, count, points, ids FROM {chunks.TABLE} ORDER BY id"
    ):
        cur.executemany(
            "INSERT INTO points (id, series_id, ts, value, rate, status, since, step) VALUES (?, ?, ?, ?, ?, ?, ?, 0.0)",
            chunks.unpack(last_id, count, blob, ids),
        )
    op.execute(f"DROP TABLE {chunks.TABLE}")
