"""Ingest: batches in, committed rows out, one group commit at a time (raw DBAPI).

One transaction per group: the batch id row, node, collector health, new series and every point
of a batch commit together or not at all, so a retried batch is a no-op and a crash cannot
half-store. (On PostgreSQL the series of a node the writer has not cached commit just before, in
their own transaction: ``series_ahead.py``; a series without points is no half-stored batch.)
After each commit the writer hands the stored points to its listeners
(``subscribe``): the latest values and, when detection runs, the sample stream. The writer knows
nothing of either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from fabricd.model import Batch
from fabricd.server.store import new_series
from fabricd.server.store.batchrows import health_rows, point_columns, point_rows, series_ids, shape_of
from fabricd.server.store.held import HeldConnection
from fabricd.server.store.new_series import NodeSeries
from fabricd.server.store.protocols import CommitListener
from fabricd.server.store.records import Committed, IngestResult, PointRow, SeriesRow
from fabricd.server.store.series_ahead import Ahead, SeriesAhead
from fabricd.server.store.sql import Database

log = logging.getLogger("fabricd.server.store")


class GroupCommitWriter:
    """Stores batches; one writer per process and database (see ``Database.write_lock``)."""

    def __init__(self, db: Database, partition_seconds: float | None = None) -> None:
        """``partition_seconds``: the width of PostgreSQL's time partitions, which no chunk spans."""
        self.db, self.partition_seconds = db, partition_seconds
        self._queue_lock = threading.Lock()
        self._queue: list[_Job] = []  # batches waiting for the next group commit
        self._series: dict[str, NodeSeries] = {}  # node -> its series ids (ingest is the only writer)
        self._listeners: list[CommitListener] = []
        self.held = HeldConnection(db.engine)  # one transaction a group, on a connection kept between them
        # PostgreSQL: a node's first batch stores its new series beside the writer (series_ahead.py)
        self.ahead = None if db.sql.serial_writes else SeriesAhead(db)

    def subscribe(self, listener: CommitListener) -> None:
        """Call ``listener.committed`` after every commit from now on, in commit order, under the
        write lock (so it sees batches exactly in ``points.id`` order). It must not raise."""
        with self.db.write_lock:
            self._listeners.append(listener)

    def ingest(self, batch: Batch, now: float, max_series_per_node: int) -> IngestResult:
        """Store one batch; returns once it is committed (durable), or raises what refused it.

        Group commit: batches that arrive while another thread writes queue up, and the next
        thread to take the write lock writes every queued batch in one transaction (one refused
        batch does not take the others with it: ``_write_group``). One commit
        (one fsync with ``synchronous=FULL``) then serves several agents, and points still get
        their ids in commit order.
        """
        ahead = (
            None if self.ahead is None else self.ahead.prepare(batch, max_series_per_node, self._series.get(batch.node))
        )
        job = _Job(batch, now, max_series_per_node, ahead)
        with self._queue_lock:
            self._queue.append(job)
        with self.db.write_lock:
            if not job.done:  # else an earlier leader wrote it while this thread waited
                with self._queue_lock:
                    group, self._queue = self._queue, []
                self._write_group(group)
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def _write_group(self, group: list[_Job]) -> None:
        """Every batch of the group in one transaction; if one of them fails it, nothing of it is
        kept and each batch is written again in a transaction of its own, so that only the failing
        one is refused. A savepoint per batch did the same at two statements a batch, ~80 µs of
        psycopg's CPU and two round trips under the write lock (docs/storage.md)."""
        try:
            if len(group) == 1 or not self._write_together(group):
                for job in group:
                    self._write_alone(job)
        finally:
            for job in group:
                if job.result is None and job.error is None:  # interrupted (KeyboardInterrupt in the leader)
                    job.error = RuntimeError("ingest was interrupted before this batch was stored")
                job.done = True

    def _write_together(self, group: list[_Job]) -> bool:
        """True when the group is done (stored, or refused whole: the database failed it, not a
        batch); False when a batch failed it and each must be written alone."""
        grown: dict[str, NodeSeries] = {}  # series added by this transaction, cached after commit
        by_batch = False
        try:
            with self.held.transaction() as cur:
                for job in group:
                    try:
                        self._store(cur, job, grown)
                    except Exception:
                        by_batch = True
                        raise
        except Exception as exc:  # rolled back
            for job in group:
                job.result, job.rows, job.last_point_id = None, [], 0
                if not by_batch:  # no connection, or the commit failed (disk full): nothing was kept
                    job.error = exc
            return not by_batch
        self._committed(group, grown)
        return True

    def _write_alone(self, job: _Job) -> None:
        grown: dict[str, NodeSeries] = {}
        try:
            with self.held.transaction() as cur:
                try:
                    self._store(cur, job, grown)
                except Exception as exc:
                    self._refuse(job, exc)
                    raise _Refused from exc
        except _Refused:  # rolled back; the job says why
            return
        except Exception as exc:  # the transaction is gone (commit failed, I/O error): nothing was kept
            job.result, job.rows, job.error = None, [], exc
            return
        self._committed([job], grown)

    def close(self) -> None:
        """Give the writer's connection back to the pool (the service's shutdown), once the group
        being written, if any, is committed."""
        with self.db.write_lock:
            self.release()

    def release(self, invalidate: bool = False) -> None:
        """Let go of the kept connections (``HeldConnection.release``): the writer's, and those
        that store series ahead of it."""
        self.held.release(invalidate)
        if self.ahead is not None:
            self.ahead.release(invalidate)

    def _committed(self, jobs: list[_Job], grown: dict[str, NodeSeries]) -> None:
        self._series.update(grown)
        self._announce([_announced(j) for j in jobs if j.rows])

    def _announce(self, batches: list[Committed]) -> None:
        if not batches:
            return
        for listener in self._listeners:
            try:
                listener.committed(batches)
            except Exception:  # the batches are stored: their agents must hear so
                log.exception("a listener of committed batches failed")

    def _store(self, cur: Any, job: _Job, grown: dict[str, NodeSeries]) -> None:
        job.series = []
        job.result, node_series, job.rows = self._write_batch(cur, job, grown)
        if node_series is not None:
            grown[job.batch.node] = node_series

    def _refuse(self, job: _Job, exc: Exception) -> None:
        # Not even an IntegrityError is "another process stored it": a retried batch id and a
        # series another replica created are ON CONFLICT no-ops (sql.py), so a violation is a
        # batch the database refused, which its agent must keep and retry, not lose as a duplicate.
        job.result, job.error, job.rows, job.last_point_id = None, exc, [], 0

    def _write_batch(
        self, cur: Any, job: _Job, grown: dict[str, NodeSeries]
    ) -> tuple[IngestResult, NodeSeries | None, list[PointRow]]:
        """The batch's statements; the node's series if this batch added some, and the point rows.
        The series it creates go to ``job.series``."""
        sql, batch, now = self.db.sql, job.batch, job.now
        node_row = (batch.node, batch.agent_version, now, now, batch.created_ts, len(batch.samples))
        if sql.claim_and_upsert_node is not None:
            cur.execute(sql.claim_and_upsert_node, (batch.node, batch.batch_id, now, len(batch.samples), *node_row))
        else:
            cur.execute(sql.claim_batch, (batch.node, batch.batch_id, now, len(batch.samples)))
            if cur.rowcount != 0:  # claimed: the node's upsert then counts one row
                cur.execute(sql.upsert_node, node_row)
        if cur.rowcount == 0:  # the unique (node, batch id): a retry of a stored batch
            return IngestResult(batch.batch_id, 0, True), None, []
        if batch.health:
            cur.executemany(sql.upsert_health, health_rows(batch.node, batch.health))
        known = grown.get(batch.node) or self._known_series(cur, batch.node, job.ahead)
        shape = shape_of(batch.samples)
        added, new = None, 0
        if shape is not None and known.shape == shape:  # the node's series, as in its last batch
            sids: Sequence[int | None] = known.shape_sids
        else:
            sids = series_ids(batch.samples, known.ids)
            if None in sids and job.ahead is not None:  # another batch of the node cached fewer: as stored
                added = new_series.load(cur, sql, batch.node)
                sids = series_ids(batch.samples, added.ids)
            if None in sids:
                added, new, sids = new_series.add(cur, sql, batch, job.limit, sids, added or known, job.series)
            if shape is not None:  # on the node's ids that commit with this batch
                (added or known).remember(shape, cast(list[int], sids))
        if job.ahead is not None:  # the series it stored ahead of the lock: announced with it
            job.series.extend(job.ahead.created)
            new += job.ahead.new
        rows: list[PointRow] = []
        if batch.samples:
            resolved = cast(Sequence[int], sids)  # every series resolved above
            rows = point_rows(batch.samples, resolved)
            columns = point_columns(batch.samples, resolved)
            # The batch's points have the ids up to its last, which the node records.
            job.packed, job.last_point_id = sql.chunks.write_marked(
                cur, batch.node, rows, sql.node_last_point, columns, self.partition_seconds
            )
            job.sids = tuple(resolved)
        return IngestResult(batch.batch_id, len(batch.samples), False, new), added, rows

    def _known_series(self, cur: Any, node: str, ahead: Ahead | None) -> NodeSeries:
        """The node's series ids, read from the table once per process (ingest is the only writer),
        or as the batch stored them ahead of the lock."""
        known = self._series.get(node)
        if known is None:
            # Only committed series exist yet in this transaction: safe to cache before commit.
            known = ahead.series if ahead is not None else new_series.load(cur, self.db.sql, node)
            self._series[node] = known
        return known


class _Refused(Exception):
    """A batch was refused: its transaction must roll back (``_Job`` holds the outcome)."""


@dataclass(slots=True)
class _Job:
    """A batch waiting for a group commit, and its outcome once ``done``."""

    batch: Batch
    now: float
    limit: int
    ahead: Ahead | None = None  # the node's series, its new ones stored before the write lock
    done: bool = False
    result: IngestResult | None = None
    error: BaseException | None = None
    rows: list[PointRow] = field(default_factory=list)  # the stored points, for the listeners
    last_point_id: int = 0  # id of the batch's last point (its points' ids are consecutive)
    series: list[SeriesRow] = field(default_factory=list)  # the series it created, with their ids
    sids: tuple[int, ...] = ()  # the rows' series ids
    packed: bytes | None = None  # the rows' chunk as stored, when one chunk holds them


def _announced(job: _Job) -> Committed:
    """What the listeners hear of a stored batch: with its series ids, and its one event time when
    the batch says it is one scrape (``first_ts == last_ts``, checked by ``wire.decode``)."""
    b = job.batch
    one = b.first_ts if b.first_ts is not None and b.first_ts == b.last_ts else None
    return Committed(b.node, job.rows, job.last_point_id, job.series, job.sids, one, job.packed)
