"""PostgreSQL: a time partition of raw chunks folded into ``step``-wide buckets, then dropped.

The buckets are those of the SQLite path (``maintenance.downsample``) and of the row fold that
PostgreSQL ran before chunks (migration 0011): per series and bucket, the bucket's start (clamped
into the partition), the newest value of a counter or the mean of a gauge, the mean of the honest
rates, "ok" when there were rates or else the newest status. A bucket keeps the id of its newest
raw point, so folded rows take nothing from the id sequence and stay below every cursor.

Chunks are packed, so the fold runs here, a node at a time and a page of chunks at a time, as
running sums per bucket: ~1 µs of maintenance CPU a raw point, once per point, where the old
``INSERT .. SELECT .. GROUP BY`` spent the server's. The buckets go to ``points`` by binary
``COPY``. Then the parent is locked (ingest waits, for milliseconds), chunks stored meanwhile (a
backlog hours late) move to a fresh table that takes the partition's place, and the partition is
dropped: no chunk is deleted one by one.
"""

from __future__ import annotations

from contextlib import closing
from typing import Any

from sqlalchemy import Connection

from fabricd.model import Kind
from fabricd.server.store import chunks, partitions
from fabricd.server.store.partitions import CHUNKS, Partition

_PAGE = 256  # chunks a read: ~5 MB of blobs
_COPY = "COPY points (id, series_id, ts, value, rate, status, since, step) FROM STDIN (FORMAT BINARY)"
_TYPES = ["int8", "int8", "float8", "float8", "float8", "text", "float8", "float8"]


class _Bucket:
    """Running sums of one series' points in one bucket; ``newest`` by (ts, id)."""

    __slots__ = ("n", "newest", "rated", "rates", "status", "total", "value")

    def __init__(self) -> None:
        self.n, self.total, self.rates, self.rated = 0, 0.0, 0.0, 0
        self.newest: tuple[float, int] = (float("-inf"), -1)
        self.value, self.status = 0.0, ""

    def add(self, pid: int, ts: float, value: float, rate: float | None, status: str) -> None:
        self.n += 1
        self.total += value
        if rate is not None:
            self.rates += rate
            self.rated += 1
        if (ts, pid) > self.newest:
            self.newest, self.value, self.status = (ts, pid), value, status

    def row(self, sid: int, start: float, step: float, counter: bool) -> tuple[Any, ...]:
        value = self.value if counter else self.total / self.n
        rate = self.rates / self.rated if self.rated else None
        return (self.newest[1], sid, start, value, rate, "ok" if self.rated else self.status, None, step)


def fold(conn: Connection, p: Partition, step: float) -> tuple[int, int]:
    """Fold the chunk partition ``p`` into rows of ``points`` and drop it; (raw points folded,
    buckets written). An empty partition is left for retention to drop."""
    partitions.serialize(conn)
    if conn.exec_driver_sql("SELECT to_regclass(%(n)s)", {"n": p.name}).scalar() is None:
        return 0, 0  # folded meanwhile by another replica's maintenance
    hi = conn.exec_driver_sql(f"SELECT max(id) FROM {p.name}").scalar()
    if hi is None:
        return 0, 0
    nodes = [n for (n,) in conn.exec_driver_sql(f"SELECT DISTINCT node FROM {p.name}")]
    raw = written = 0
    with closing(conn.connection.cursor()) as cur:  # psycopg's, in this transaction: binary reads, COPY
        for node in nodes:
            n, rows = _fold_node(cur, p, node, int(hi), step)
            with cur.copy(_COPY) as copy:
                copy.set_types(_TYPES)
                for row in rows:
                    copy.write_row(row)
            raw, written = raw + n, written + len(rows)
    _replace(conn, p, int(hi))
    return raw, written


def _fold_node(cur: Any, p: Partition, node: str, hi: int, step: float) -> tuple[int, list[tuple[Any, ...]]]:
    """The buckets of ``node``'s chunks in ``p`` up to id ``hi``, and how many raw points they fold."""
    cur.execute("SELECT id, kind FROM series WHERE node = %s", (node,))
    counters = {sid for sid, kind in cur.fetchall() if kind == Kind.COUNTER.value}
    buckets: dict[tuple[int, float], _Bucket] = {}
    read = f"SELECT id, count, points, ids FROM {p.name} WHERE node = %s AND id > %s AND id <= %s ORDER BY id LIMIT {_PAGE}"
    after, n = 0, 0
    while True:
        cur.execute(read, (node, after, hi), binary=True)
        page = cur.fetchall()
        for last_id, count, blob, ids in page:
            for pid, sid, ts, value, rate, status, _since in chunks.unpack_stored(last_id, count, blob, ids):
                key = (sid, max(ts // step * step, p.start))
                bucket = buckets.get(key)
                if bucket is None:
                    bucket = buckets[key] = _Bucket()
                bucket.add(pid, ts, value, rate, status)
                n += 1
        if len(page) < _PAGE:
            break
        after = page[-1][0]
    rows = [b.row(sid, start, step, sid in counters) for (sid, start), b in sorted(buckets.items())]
    return n, rows


def _replace(conn: Connection, p: Partition, hi: int) -> None:
    """Drop the folded partition; chunks stored in it after the fold read it (ids above ``hi``)
    move first to a table that takes its place, raw, for the next fold."""
    partitions.run(conn, f"LOCK TABLE {CHUNKS.table} IN ACCESS EXCLUSIVE MODE")
    late = conn.exec_driver_sql(f"SELECT count(*) FROM {p.name} WHERE id > %(hi)s", {"hi": hi}).scalar()
    if not late:
        partitions.run(conn, f"DROP TABLE {p.name}")
        return
    new = f"{p.name}_late"
    partitions.run(conn, f"CREATE TABLE {new} (LIKE {CHUNKS.table} INCLUDING ALL)")
    conn.exec_driver_sql(f"INSERT INTO {new} SELECT * FROM {p.name} WHERE id > %(hi)s", {"hi": hi})
    partitions.bound(conn, CHUNKS, new, p.start, p.end)
    partitions.run(conn, f"DROP TABLE {p.name}")
    partitions.run(conn, f"ALTER TABLE {new} RENAME TO {p.name}")
    partitions.attach(conn, CHUNKS, p.name, new, p.start, p.end)
