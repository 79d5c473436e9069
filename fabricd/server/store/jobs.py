"""The jobs table: what the agents reported (``record``) and the jobs as the API and the join see them.

A job is its rows, one per node; it is running while one of them has no ``ended_ts``. Times are
the agents' event times, so the join with incidents (also in event time) does not depend on when
batches arrived.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session, sessionmaker

from fabricd.jobmap import JobPlacement
from fabricd.server import tables as t
from fabricd.server.jobreports import JobReport, JobSeen
from fabricd.server.store.records import NotFound
from fabricd.server.store.sql import Database

REFRESH_SECONDS = 60.0  # an unchanged node's jobs are written at most this often (last_ts resolution)


class Jobs:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.sessions = sessionmaker(db.engine, expire_on_commit=False)
        # node -> (the jobs its last written report named, that report's time): every agent reports
        # every scrape, and a 2,000-node fleet would otherwise write 200 unchanged rows a second.
        self._written: dict[str, tuple[tuple[JobSeen, ...], float]] = {}

    def record(self, reports: Sequence[JobReport]) -> None:
        """Apply one batch's reports, oldest first (a retried batch changes nothing: max/min times)."""
        todo = [r for r in reports if self._news(r)]
        if not todo:
            return
        with self.db.write_lock, self.sessions.begin() as s:
            for report in todo:
                self._apply(s, report)

    def _news(self, report: JobReport) -> bool:
        last = self._written.get(report.node)
        if last is not None and last[0] == report.jobs and 0 <= report.ts - last[1] < REFRESH_SECONDS:
            return False
        if report.complete or last is None or last[0] != report.jobs:
            self._written[report.node] = (report.jobs, report.ts)
        return True

    def _apply(self, s: Session, report: JobReport) -> None:
        for seen in report.jobs:
            row = s.get(t.JobNode, (seen.job_id, report.node))
            if row is None:
                s.add(_row(seen, report.node, report.ts))
                continue
            if row.ended_ts is not None and report.ts > row.ended_ts:
                row.ended_ts = None  # requeued: the same id runs here again
            if report.ts >= row.last_ts:
                row.user, row.name, row.gpus, row.hcas = seen.user, seen.name, seen.gpus, seen.hcas
                row.last_ts = report.ts
            row.first_ts = min(row.first_ts, report.ts)
        if report.complete:
            named = {seen.job_id for seen in report.jobs}
            q = select(t.JobNode).where(t.JobNode.node == report.node, t.JobNode.ended_ts.is_(None))
            for row in s.scalars(q):
                if row.job_id not in named and row.last_ts < report.ts:
                    row.ended_ts = report.ts
        s.flush()

    def running(self) -> list[JobPlacement]:
        """Jobs with at least one node still reporting them, by id, on the nodes that still do."""
        with self.sessions() as s:
            return _placements(s.scalars(select(t.JobNode).where(t.JobNode.ended_ts.is_(None))))

    def expire(self, before: float) -> int:
        """Forget the nodes of jobs that ended before ``before`` (event time); how many rows went."""
        with self.db.write_lock, self.sessions.begin() as s:
            ended = (t.JobNode.ended_ts.is_not(None), t.JobNode.ended_ts < before)
            rows = list(s.scalars(select(t.JobNode.job_id).where(*ended)))
            s.execute(delete(t.JobNode).where(*ended))
            return len(rows)

    def get(self, job_id: str) -> JobPlacement:
        with self.sessions() as s:
            found = _placements(s.scalars(select(t.JobNode).where(t.JobNode.job_id == job_id)))
        if not found:
            raise NotFound(f"job {job_id!r} has not been reported by any agent")
        return found[0]

    def overlapping(self, start: float, end: float) -> list[JobPlacement]:
        """Jobs that ran at some time between ``start`` and ``end`` (event time)."""
        with self.sessions() as s:
            q = select(t.JobNode).where(
                t.JobNode.first_ts <= end, or_(t.JobNode.ended_ts.is_(None), t.JobNode.ended_ts >= start)
            )
            return _placements(s.scalars(q))


def _row(seen: JobSeen, node: str, ts: float) -> t.JobNode:
    return t.JobNode(
        job_id=seen.job_id,
        node=node,
        scheduler=seen.scheduler,
        user=seen.user,
        name=seen.name,
        gpus=seen.gpus,
        hcas=seen.hcas,
        first_ts=ts,
        last_ts=ts,
        ended_ts=None,
    )


def _placements(rows: Iterable[t.JobNode]) -> list[JobPlacement]:
    by_job: dict[str, list[t.JobNode]] = {}
    for row in rows:
        by_job.setdefault(row.job_id, []).append(row)
    return [_placement(job_id, sorted(rs, key=lambda r: r.node)) for job_id, rs in sorted(by_job.items(), key=_order)]


def _order(item: tuple[str, list[t.JobNode]]) -> tuple[int, str]:
    job_id = item[0]
    return (int(job_id), "") if job_id.isdigit() else (1 << 62, job_id)


def _placement(job_id: str, rows: list[t.JobNode]) -> JobPlacement:
    newest = max(rows, key=lambda r: r.last_ts)
    ended = [r.ended_ts for r in rows]
    return JobPlacement(
        job_id=job_id,
        user=newest.user,
        name=newest.name,
        scheduler=newest.scheduler,
        nodes={r.node: tuple(h for h in r.hcas.split(",") if h) for r in rows},
        first_ts=min(r.first_ts for r in rows),
        last_ts=newest.last_ts,
        ended_ts=None if any(e is None for e in ended) else max(e for e in ended if e is not None),
    )
