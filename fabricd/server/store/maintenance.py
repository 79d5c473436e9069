"""Maintenance: fold old raw points into buckets, delete past retention (Core).

Set-based statements over ``points`` and ``ingested_batches``: SQLAlchemy Core, no entities.
``downsample`` is the pure fold, shared with ``/api/v1/series?step=``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, insert, select

from fabricd.model import Kind
from fabricd.server import tables as t
from fabricd.server.store.records import MaintenanceReport
from fabricd.server.store.sql import Database

_P, _S, _B = (t.Base.metadata.tables[name] for name in ("points", "series", "ingested_batches"))
RawPoint = tuple[float, float, float | None, str]  # ts, value, rate, status


class Maintenance:
    def __init__(self, db: Database) -> None:
        self.db = db

    def run(self, now: float, raw_retention: float, step: float, retention: float) -> MaintenanceReport:
        """Downsample raw points older than ``raw_retention`` into ``step`` buckets; drop past ``retention``.

        Only whole buckets are folded (the cutoff is aligned down to ``step``), so running this
        twice never writes two points for one bucket.
        """
        cutoff = (now - raw_retention) // step * step
        folded = written = 0
        for sid, kind in self._series_with_raw_before(cutoff):
            n, w = self._downsample_series(sid, kind, cutoff, step)
            folded, written = folded + n, written + w
        with self.db.write_lock, self.db.engine.begin() as conn:
            dp = conn.execute(delete(_P).where(_P.c.ts < now - retention)).rowcount
            db = conn.execute(delete(_B).where(_B.c.received_ts < now - retention)).rowcount
        return MaintenanceReport(folded, written, int(dp or 0), int(db or 0))

    def _series_with_raw_before(self, cutoff: float) -> list[tuple[int, str]]:
        q = (
            select(_P.c.series_id, _S.c.kind)
            .join(_S, _S.c.id == _P.c.series_id)
            .where(_P.c.step == 0.0, _P.c.ts < cutoff)
            .distinct()
        )
        with self.db.engine.connect() as conn:
            return [(int(a), str(b)) for a, b in conn.execute(q)]

    def _downsample_series(self, sid: int, kind: str, cutoff: float, step: float) -> tuple[int, int]:
        raw_of_series = (_P.c.series_id == sid, _P.c.step == 0.0, _P.c.ts < cutoff)
        with self.db.write_lock, self.db.engine.begin() as conn:
            q = select(_P.c.ts, _P.c.value, _P.c.rate, _P.c.status).where(*raw_of_series).order_by(_P.c.ts)
            raw = [(ts, value, rate, status) for ts, value, rate, status in conn.execute(q)]
            buckets = downsample(raw, step, counter=kind == Kind.COUNTER.value)
            conn.execute(delete(_P).where(*raw_of_series))
            if buckets:
                conn.execute(insert(_P), [{"series_id": sid, "step": step, "since": None, **b} for b in buckets])
            return len(raw), len(buckets)


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
