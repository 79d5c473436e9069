"""The paths table: each probed pair's last traced path (``record``), and the paths as the API and
detection read them (``all``).

A trace that finds the pair's current hops again only moves ``traced_ts`` (written at most every
``REFRESH_SECONDS`` of event time); one that finds other hops replaces them and counts a new
``version``. An older report than the row (a spooled batch drained late) changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from fabricd.server import tables as t
from fabricd.server.pathreports import PathReport
from fabricd.server.store.records import PathRecord
from fabricd.server.store.sql import Database

REFRESH_SECONDS = 60.0


class Paths:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.sessions = sessionmaker(db.engine, expire_on_commit=False)
        self._written: dict[tuple[str, str, str], tuple[tuple[str | None, ...], float]] = {}
        self.generation = 0  # moves with every new or changed path (readers cache on it)

    def record(self, reports: Sequence[PathReport]) -> None:
        todo = [r for r in reports if self._news(r)]
        if not todo:
            return
        with self.db.write_lock, self.sessions.begin() as s:
            for report in todo:
                self._apply(s, report)

    def _news(self, r: PathReport) -> bool:
        last = self._written.get((r.node, r.peer, r.direction))
        if last is not None and last[0] == r.hops and 0 <= r.ts - last[1] < REFRESH_SECONDS:
            return False
        self._written[(r.node, r.peer, r.direction)] = (r.hops, r.ts)
        return True

    def _apply(self, s: Session, r: PathReport) -> None:
        row = s.get(t.TracedPath, (r.node, r.peer, r.direction))
        if row is None:
            s.add(_row(r))
            self._changed()
            return
        if r.ts < row.traced_ts:
            return
        if list(r.hops) != list(row.hops) or (r.src, r.src_port, r.dst, r.dst_port) != (
            row.src,
            row.src_port,
            row.dst,
            row.dst_port,
        ):
            row.src, row.src_port, row.dst, row.dst_port = r.src, r.src_port, r.dst, r.dst_port
            row.hops, row.reached, row.version, row.changed_ts = list(r.hops), r.reached, row.version + 1, r.ts
            self._changed()
        row.traced_ts = r.ts

    def _changed(self) -> None:
        self.generation += 1

    def all(self) -> list[PathRecord]:
        with self.sessions() as s:
            rows = s.scalars(
                select(t.TracedPath).order_by(t.TracedPath.node, t.TracedPath.peer, t.TracedPath.direction)
            )
            return [_record(row) for row in rows]


def _row(r: PathReport) -> t.TracedPath:
    return t.TracedPath(
        node=r.node,
        peer=r.peer,
        direction=r.direction,
        src=r.src,
        src_port=r.src_port,
        dst=r.dst,
        dst_port=r.dst_port,
        hops=list(r.hops),
        reached=r.reached,
        version=1,
        changed_ts=r.ts,
        traced_ts=r.ts,
    )


def _record(row: t.TracedPath) -> PathRecord:
    return PathRecord(
        row.node,
        row.peer,
        row.src,
        row.src_port,
        row.dst,
        row.dst_port,
        tuple(row.hops),
        row.reached,
        row.version,
        row.changed_ts,
        row.traced_ts,
        row.direction,
    )
