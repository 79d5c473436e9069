"""Maintenance: fold old raw points into buckets, delete past retention (Core).

Raw points are chunks (``chunks.py``), folded into rows of ``points``. ``downsample`` is the pure
fold, shared with ``/api/v1/series?step=``. On PostgreSQL both tables are in time partitions
(``partitions.py``): whole partitions are created ahead, folded (``chunk_fold.py``) and dropped;
only the default partitions' strays past retention are deleted row by row. On SQLite the chunks
are folded a node at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import MetaData, delete

from fabricd.model import Kind
from fabricd.server import tables as t
from fabricd.server.store import chunk_fold, chunks, partitions
from fabricd.server.store.records import MaintenanceReport
from fabricd.server.store.sql import Database

_P, _B = (t.Base.metadata.tables[name] for name in ("points", "ingested_batches"))
# PostgreSQL's folded points outside every time partition: retention deletes these row by row.
_STRAYS = _P.to_metadata(MetaData(), name=partitions.DEFAULT)
RawPoint = tuple[float, float, float | None, str]  # ts, value, rate, status
_INSERT_FOLDED = "INSERT INTO points (series_id, ts, value, rate, status, step) VALUES (?, ?, ?, ?, ?, ?)"


class Maintenance:
    def __init__(self, db: Database, partition_seconds: float = partitions.PARTITION_SECONDS) -> None:
        self.db, self.partition_seconds = db, partition_seconds
        self.partitioned = db.engine.dialect.name == "postgresql"

    def run(self, now: float, raw_retention: float, step: float, retention: float) -> MaintenanceReport:
        """Downsample raw points older than ``raw_retention`` into ``step`` buckets; drop past ``retention``.

        Only whole buckets are folded (the cutoff is aligned down to ``step``), so running this
        twice never writes two points for one bucket. On PostgreSQL a partition is folded once it
        lies wholly before the cutoff, so raw points stay up to ``PARTITION_SECONDS`` longer.
        """
        cutoff = (now - raw_retention) // step * step
        if self.partitioned:
            folded, written, dropped = self._partitions(now, cutoff, step, retention)
            points, raw = _STRAYS, partitions.CHUNKS_DEFAULT
        else:
            (folded, written), dropped = self._fold_chunks(cutoff, step), 0
            points, raw = _P, chunks.TABLE
        with self.db.write_lock, self.db.engine.begin() as conn:
            dp = conn.execute(delete(points).where(points.c.ts < now - retention)).rowcount
            db = conn.execute(delete(_B).where(_B.c.received_ts < now - retention)).rowcount
        # Raw chunks never folded: strays outside every partition, or folding failed for days.
        with self.db.write_lock, self.db.cursor(transaction=True) as cur:
            dropped += chunks.delete_before(cur, now - retention, raw, self.db.sql.mark)
        return MaintenanceReport(folded, written, int(dp or 0) + dropped, int(db or 0))

    def _fold_chunks(self, cutoff: float, step: float) -> tuple[int, int]:
        """SQLite's raw points before the cutoff, taken out of their chunks and folded node by node,
        one transaction each: (raw points folded, buckets written)."""
        with self.db.cursor() as cur:
            nodes = chunks.nodes_before(cur, cutoff)
            kinds = dict(cur.execute("SELECT id, kind FROM series").fetchall()) if nodes else {}
        folded = written = 0
        for node in nodes:
            with self.db.write_lock, self.db.cursor(transaction=True) as cur:
                raw = chunks.take_node_before(cur, node, cutoff)
                buckets = [
                    (sid, b["ts"], b["value"], b["rate"], b["status"], step)
                    for sid, points in raw.items()
                    for b in downsample(points, step, counter=kinds.get(sid) == Kind.COUNTER.value)
                ]
                cur.executemany(_INSERT_FOLDED, buckets)
            folded, written = folded + sum(len(p) for p in raw.values()), written + len(buckets)
        return folded, written

    def prepare(self, now: float) -> None:
        """Partitions for now and ahead (PostgreSQL; nothing on SQLite): the service's start."""
        if self.partitioned:
            with self.db.engine.begin() as conn:
                partitions.ensure(conn, now, self.partition_seconds)

    def _partitions(self, now: float, cutoff: float, step: float, retention: float) -> tuple[int, int, int]:
        """Create ahead, fold the chunk partitions wholly before ``cutoff``, drop those wholly past
        retention: (raw points folded, buckets written, points dropped). One transaction each."""
        self.prepare(now)
        folded = written = 0
        with self.db.engine.connect() as conn:
            due = [p for p in partitions.partitions(conn, partitions.CHUNKS) if now - retention < p.end <= cutoff]
        for p in due:
            with self.db.engine.begin() as conn:
                n, w = chunk_fold.fold(conn, p, step)
            folded, written = folded + n, written + w
        with self.db.engine.begin() as conn:
            _gone, dropped = partitions.drop_before(conn, now - retention)
        return folded, written, dropped


def downsample(raw: Sequence[RawPoint], step: float, counter: bool) -> list[dict[str, Any]]:
    """Fold (ts, value, rate, status) points into ``step``-wide buckets (pure, for tests).

    A bucket keeps its start time, the mean of the honest rates (None when there were none), and
    the last value for counters (a cumulative total) or the mean value for gauges.
    """
    groups: dict[float, list[RawPoint]] = {}
    for p in raw:
        groups.setdefault(p[0] // step * step, []).append(p)
    out = []
    for start, pts in sorted(groups.items()):
        rates = [p[2] for p in pts if p[2] is not None]
        value = pts[-1][1] if counter else sum(p[1] for p in pts) / len(pts)
        out.append(
            {
                "ts": start,
                "value": value,
                "rate": sum(rates) / len(rates) if rates else None,
                "status": "ok" if rates else pts[-1][3],
            }
        )
    return out
