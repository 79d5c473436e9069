"""The storage API: everything the service reads and writes goes through ``Store``.

One ``Store`` per process owns the engine and a write lock. Writes are serialized by that lock so
SQLite never sees two writers (which would fail with "database is locked" instead of queueing) and
so ``points.id`` order is commit order on every backend: the detection engine's cursor
(``read_samples_since``) can then never skip a point committed late with a smaller id.
Batch ingest is one transaction: the batch id row, node, collector health, new series and every
point commit together or not at all, so a retried batch is a no-op and a crash cannot half-store.
The latest value of each series lives in memory (``_Latest``) and is written to the series table
every few seconds; the points just stored also stay in memory for the detection stream (``_Tail``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import secrets
import sys
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Engine, delete, func, insert, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from fabricd.model import Batch, CollectorHealth, Incident, Kind, Labels, Reading, Sample, Status
from fabricd.server import tables as t

SeriesKey = tuple[str, str, str, str, str, str]  # node, source, device, port, counter, labels JSON
TOKEN_PREFIX = "fabricd_"
# Series identities kept for the detection stream: ~200 bytes each, so ~200 MB at most.
IDENTITY_CACHE_MAX = 1_000_000
ROLES = ("agent", "read", "admin")


class SeriesLimitExceeded(Exception):
    def __init__(self, node: str, limit: int, existing: int, new: int) -> None:
        super().__init__(
            f"node {node!r} would have {existing + new} distinct series, over the limit of {limit} "
            f"(limits.max_series_per_node); {new} new series in this batch were refused"
        )
        self.node, self.limit, self.existing, self.new = node, limit, existing, new


class NotFound(LookupError):
    pass


class Conflict(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class IngestResult:
    batch_id: str
    accepted: int
    duplicate: bool
    new_series: int = 0


@dataclass(frozen=True, slots=True)
class TokenInfo:
    id: int
    role: str
    node: str | None
    note: str
    created_ts: float
    revoked_ts: float | None


@dataclass(frozen=True, slots=True)
class SeriesInfo:
    id: int
    node: str
    reading: Reading  # identity (value 0); the latest point is carried separately
    latest: Sample | None


@dataclass(frozen=True, slots=True)
class MaintenanceReport:
    downsampled_points: int
    buckets_written: int
    deleted_points: int
    deleted_batches: int


@functools.lru_cache(maxsize=65_536)
def labels_json(labels: tuple[tuple[str, str], ...]) -> str:
    """Canonical JSON of a label tuple (cached: a fleet has few distinct label sets)."""
    return json.dumps(dict(labels), sort_keys=True, separators=(",", ":")) if labels else "{}"


def series_key(node: str, r: Reading) -> SeriesKey:
    return (node, r.source, r.device, r.port, r.counter, labels_json(r.labels))


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _reading_of(row: t.Series) -> Reading:
    labels = tuple(sorted(json.loads(row.labels).items()))
    return Reading(
        source=row.source,
        device=row.device,
        port=row.port,
        counter=row.counter,
        value=0.0,
        unit=row.unit,
        kind=Kind(row.kind),
        labels=labels,
        name=row.name,
    )


def _latest_of(row: t.Series, reading: Reading) -> Sample | None:
    if row.latest_ts is None or row.latest_value is None:
        return None
    r = Reading(
        reading.source,
        reading.device,
        reading.port,
        reading.counter,
        row.latest_value,
        reading.unit,
        reading.kind,
        reading.labels,
        reading.name,
    )
    return Sample(
        ts=row.latest_ts,
        reading=r,
        rate=row.latest_rate,
        status=Status(row.latest_status or "ok"),
        since=row.latest_since,
    )


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)
        self._write_lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queue: list[_Job] = []  # batches waiting for the next group commit
        self._identity: dict[int, tuple[str, Reading]] = {}  # series id -> (node, reading), see read_samples_since
        self._series: dict[str, _NodeSeries] = {}  # node -> its series ids (the series table is small)
        self._sql = _IngestSql.for_marker("?" if engine.dialect.paramstyle == "qmark" else "%s")
        self._driver_integrity_error: type[Exception] = engine.dialect.loaded_dbapi.IntegrityError
        self._latest = _Latest()
        self._tail: _Tail | None = None  # recently stored points for the detection stream (keep_tail)

    # ---- ingest -------------------------------------------------------------------------------

    def ingest(self, batch: Batch, now: float, max_series_per_node: int) -> IngestResult:
        """Store one batch; returns once it is committed (durable), or raises what refused it.

        Group commit: batches that arrive while another thread writes queue up, and the next
        thread to take the write lock writes every queued batch in one transaction (each batch
        in its own savepoint, so one refused batch does not take the others with it). One commit
        (one fsync with ``synchronous=FULL``) then serves several agents, and points still get
        their ids in commit order.
        """
        job = _Job(batch, now, max_series_per_node)
        with self._queue_lock:
            self._queue.append(job)
        with self._write_lock:
            if not job.done:  # else an earlier leader wrote it while this thread waited
                with self._queue_lock:
                    group, self._queue = self._queue, []
                self._write_group(group)
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def _write_group(self, group: list[_Job]) -> None:
        grown: dict[str, _NodeSeries] = {}  # series added by this transaction, cached after commit
        try:
            with self.engine.begin() as conn:
                cur = conn.connection.cursor()
                try:
                    for job in group:
                        self._write_job(cur, job, grown)
                finally:
                    cur.close()
        except Exception as exc:  # the transaction is gone (commit failed, I/O error): nothing was kept
            for job in group:
                if job.error is None:
                    job.result, job.error = None, exc
        else:
            self._series.update(grown)
            tail = self._tail
            for job in group:
                if job.latest:
                    self._latest.apply(job.batch.node, job.latest)
                    if tail is not None and job.last_point_id:
                        tail.append(job.last_point_id, job.latest)
        finally:
            for job in group:
                if job.result is None and job.error is None:  # interrupted (KeyboardInterrupt in the leader)
                    job.error = RuntimeError("ingest was interrupted before this batch was stored")
                job.done = True

    def _write_job(self, cur: Any, job: _Job, grown: dict[str, _NodeSeries]) -> None:
        """One batch in a savepoint: refused (series limit, a driver error), it leaves no trace."""
        cur.execute("SAVEPOINT fabricd_batch")
        try:
            job.result, node_series, job.latest = self._write_batch(cur, job.batch, job.now, job.limit, grown)
            if job.latest and self._tail is not None:
                cur.execute(self._sql.last_point_id)  # the batch's points have the ids up to here
                job.last_point_id = int(cur.fetchone()[0])
        except Exception as exc:
            cur.execute("ROLLBACK TO SAVEPOINT fabricd_batch")  # raises if the transaction is gone
            job.latest, job.last_point_id = [], 0
            if isinstance(exc, IntegrityError | self._driver_integrity_error):
                # Another process stored the same batch id (or series) first: nothing of ours was kept.
                job.result = IngestResult(job.batch.batch_id, 0, True)
            else:
                job.error = exc
        else:
            if node_series is not None:
                grown[job.batch.node] = node_series
        cur.execute("RELEASE SAVEPOINT fabricd_batch")

    def _write_batch(
        self, cur: Any, batch: Batch, now: float, limit: int, grown: dict[str, _NodeSeries]
    ) -> tuple[IngestResult, _NodeSeries | None, list[PointRow]]:
        """The batch's statements on the raw DBAPI cursor; the node's series if this batch added
        some, and the point rows (their latest values are kept once the transaction commits)."""
        sql = self._sql
        cur.execute(sql.claim_batch, (batch.node, batch.batch_id, now, len(batch.samples)))
        if cur.rowcount == 0:  # the unique (node, batch id): a retry of a stored batch
            return IngestResult(batch.batch_id, 0, True), None, []
        cur.execute(sql.upsert_node, (batch.node, batch.agent_version, now, now, batch.created_ts, len(batch.samples)))
        if batch.health:
            cur.executemany(sql.upsert_health, _health_rows(batch.node, batch.health))
        known = grown.get(batch.node) or self._known_series(cur, batch.node)
        sids = _series_ids(batch.samples, known.ids)
        added = None
        if None in sids:
            added = self._add_series(cur, batch, sids, known, limit)
            sids = _series_ids(batch.samples, added.ids)
        rows: list[PointRow] = []
        if batch.samples:
            rows = _point_rows(batch.samples, cast(list[int], sids))  # every series resolved above
            sql.insert_points.run(cur, rows)
        new = added.count - known.count if added is not None else 0
        return IngestResult(batch.batch_id, len(batch.samples), False, new), added, rows

    def _known_series(self, cur: Any, node: str) -> _NodeSeries:
        """The node's series ids, read from the table once per process (ingest is the only writer)."""
        known = self._series.get(node)
        if known is None:
            # Only committed series exist yet in this transaction: safe to cache before commit.
            known = self._series[node] = self._load_series(cur, node)
        return known

    def _load_series(self, cur: Any, node: str) -> _NodeSeries:
        cur.execute(self._sql.node_series, (node,))
        ids = {(src, dev, port, ctr, _labels_of_json(labels)): sid for sid, src, dev, port, ctr, labels in cur}
        return _NodeSeries(ids, len(ids))

    def _add_series(
        self, cur: Any, batch: Batch, sids: list[int | None], known: _NodeSeries, limit: int
    ) -> _NodeSeries:
        """Insert the batch's new series (after checking the limit); the node's ids, reloaded."""
        fresh: dict[SeriesKey, Reading] = {}
        for sid, s in zip(sids, batch.samples, strict=True):
            if sid is None and not _alias(known.ids, s.reading):
                fresh.setdefault(series_key(batch.node, s.reading), s.reading)
        if not fresh:
            return known
        if known.count + len(fresh) > limit:
            raise SeriesLimitExceeded(batch.node, limit, known.count, len(fresh))
        cur.executemany(
            self._sql.insert_series,
            [(*k, r.metric, r.unit, r.kind.value) for k, r in fresh.items()],
        )
        grown = self._load_series(cur, batch.node)
        grown.ids.update(known.ids)  # keep aliases of unsorted label tuples
        return grown

    # ---- detection stream ---------------------------------------------------------------------

    def read_samples_since(self, cursor: int, limit: int = 20_000) -> tuple[list[tuple[str, Sample]], int]:
        """Raw samples stored after ``cursor`` in ingest order, and the cursor to pass next time.

        The detection loop reads every point ingest stores, so this is on the hot path too: points
        are read as plain tuples and joined in memory with the series identities (``_identities``),
        which never change once a series exists.
        """
        tail = self._tail
        if tail is not None and (served := tail.since(cursor, limit)) is not None:
            points, upto = served
            return _samples_of(points, self._identities_of({p[1] for p in points})), upto
        with self.engine.connect() as conn:
            cur = conn.connection.cursor()
            try:
                cur.execute(self._sql.read_points, (cursor, limit))
                rows = cur.fetchall()
                idents = self._identities(cur, {row[1] for row in rows})
            finally:
                cur.close()
        return _samples_of(rows, idents), (rows[-1][0] if rows else cursor)

    def keep_tail(self, max_points: int = 100_000) -> None:
        """Keep the last ``max_points`` stored points in memory for ``read_samples_since`` (the
        detection loop calls this): a reader that keeps up gets them without reading them back
        from the database; one that fell further behind reads the database as before."""
        with self._write_lock:
            if self._tail is None:
                self._tail = _Tail(self._max_point_id(), max_points)

    def _identities(self, cur: Any, ids: set[int]) -> dict[int, tuple[str, Reading]]:
        """(node, reading with value 0) of each series id, from the cache or the series table."""
        cache = self._identity
        missing = [sid for sid in ids if sid not in cache]
        if len(cache) + len(missing) > IDENTITY_CACHE_MAX:
            cache.clear()  # bounded memory for a huge fleet: refill from the table
            missing = list(ids)
        for start in range(0, len(missing), 2000):  # 2,000 ids: under both drivers' parameter limits
            chunk = missing[start : start + 2000]
            if self._sql.mark == "%s":  # one array parameter: psycopg re-parses long query texts
                cur.execute(self._sql.series_identity.format(ids="= ANY(%s)"), (chunk,))
            else:
                cur.execute(self._sql.series_identity.format(ids=f"IN ({', '.join('?' * len(chunk))})"), chunk)
            for sid, node, *rest in cur.fetchall():
                cache[sid] = (sys.intern(node), _identity_reading(*rest))
        return cache

    def last_point_id(self) -> int:
        with self.sessions() as s:
            return int(s.scalar(select(func.max(t.Point.id))) or 0)

    def get_cursor(self, name: str) -> int:
        with self.sessions() as s:
            row = s.get(t.Cursor, name)
            return row.position if row else 0

    def set_cursor(self, name: str, position: int) -> None:
        with self._write_lock, self.sessions.begin() as s:
            row = s.get(t.Cursor, name)
            if row is None:
                s.add(t.Cursor(name=name, position=position))
            else:
                row.position = position

    # ---- reads for the API and /metrics -------------------------------------------------------

    def latest(
        self, node: str | None = None, source: str | None = None, fresh_since: float | None = None
    ) -> list[tuple[str, Sample]]:
        """The latest sample of each series (optionally of one node/source, seen since a time),
        ordered by node, then series id.

        ``/metrics`` calls this for the whole fleet on every scrape: the values come from memory
        (``_Latest``) and are joined with the cached series identities, as ``read_samples_since``.
        """
        self.load_latest()
        rows = self._latest.rows(node, fresh_since)
        idents = self._identities_of({row[0] for row in rows})
        if source is not None:
            rows = [row for row in rows if (ident := idents.get(row[0])) is not None and ident[1].source == source]
        return _latest_samples(rows, idents)

    def _identities_of(self, ids: set[int]) -> dict[int, tuple[str, Reading]]:
        """``_identities`` without opening a connection when every id is cached (the usual case)."""
        cache = self._identity
        if all(sid in cache for sid in ids):
            return cache
        with self.engine.connect() as conn:
            cur = conn.connection.cursor()
            try:
                return self._identities(cur, ids)
            finally:
                cur.close()

    # ---- latest values: in memory, written to the series table every few seconds --------------

    def load_latest(self) -> None:
        """Fill the in-memory latest values from the series table, then replay the raw points
        stored after the last flush (a crash loses no latest value). Once per process; the service
        calls it at start-up, and every reader of latest values first."""
        if self._latest.loaded:
            return
        with self._write_lock:
            if self._latest.loaded:
                return
            with self.engine.connect() as conn:
                cur = conn.connection.cursor()
                try:
                    self._latest.load(cur, self._sql)
                finally:
                    cur.close()

    def flush_latest(self, chunk: int = 20_000) -> int:
        """Write the latest values changed since the last flush to the series table; returns how
        many series rows were written.

        The point id cursor ``latest`` moves with the last chunk: every raw point up to it has its
        latest value in the table, and ``load_latest`` replays the points after it. On SQLite each
        chunk takes the write lock (one writer), so ingest waits for a chunk, never for the whole
        flush; PostgreSQL runs the chunks beside ingest, which no longer updates series rows.
        """
        self.load_latest()
        with self._write_lock:
            dirty = self._latest.take_dirty()
            upto = self._max_point_id()
        if not dirty and upto <= self._latest.flushed_upto:
            return 0
        rows = list(dirty.values())
        serialize = self._sql.mark == "?"
        try:
            for start in range(0, max(1, len(rows)), chunk):
                part = rows[start : start + chunk]
                last = start + chunk >= len(rows)
                with self._write_lock if serialize else contextlib.nullcontext(), self.engine.begin() as conn:
                    cur = conn.connection.cursor()
                    try:
                        self._sql.update_latest.run(cur, part)
                        if last:
                            cur.execute(self._sql.upsert_cursor, (LATEST_CURSOR, upto))
                    finally:
                        cur.close()
        except BaseException:
            self._latest.restore_dirty(dirty)  # written chunks are written again next time: harmless
            raise
        self._latest.flushed_upto = upto
        return len(rows)

    def unflushed_latest(self) -> int:
        """Series whose latest value is only in memory (``fabricd_store_latest_unflushed_series``)."""
        return self._latest.pending()

    def _max_point_id(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT max(id) FROM points").scalar() or 0)

    def find_series(
        self,
        node: str | None = None,
        device: str | None = None,
        port: str | None = None,
        counter: str | None = None,
        source: str | None = None,
        limit: int = 100,
    ) -> list[SeriesInfo]:
        q = select(t.Series).order_by(t.Series.node, t.Series.id).limit(limit)
        for col, val in (
            (t.Series.node, node),
            (t.Series.device, device),
            (t.Series.port, port),
            (t.Series.source, source),
        ):
            if val is not None:
                q = q.where(col == val)
        if counter is not None:
            q = q.where(or_(t.Series.counter == counter, t.Series.name == counter))
        self.load_latest()
        with self.sessions() as s:
            return [
                SeriesInfo(row.id, row.node, (r := _reading_of(row)), self._latest_sample(row, r))
                for row in s.scalars(q)
            ]

    def _latest_sample(self, row: t.Series, reading: Reading) -> Sample | None:
        mem = self._latest.get(row.node, row.id)
        if mem is None:
            return _latest_of(row, reading)
        _sid, ts, value, rate, status, since = mem
        r = Reading(
            reading.source,
            reading.device,
            reading.port,
            reading.counter,
            value,
            reading.unit,
            reading.kind,
            reading.labels,
            reading.name,
        )
        return Sample(ts, r, rate, _STATUSES.get(status or "ok") or Status(status), since)

    def points(self, series_id: int, since: float, until: float, limit: int = 10_000) -> list[t.Point]:
        q = (
            select(t.Point)
            .where(t.Point.series_id == series_id, t.Point.ts >= since, t.Point.ts <= until)
            .order_by(t.Point.ts)
            .limit(limit)
        )
        with self.sessions() as s:
            return list(s.scalars(q))

    def nodes(self) -> list[tuple[t.Node, list[t.CollectorStatus], int]]:
        with self.sessions() as s:
            nodes = list(s.scalars(select(t.Node).order_by(t.Node.name)))
            health: dict[str, list[t.CollectorStatus]] = {}
            for h in s.scalars(select(t.CollectorStatus).order_by(t.CollectorStatus.collector)):
                health.setdefault(h.node, []).append(h)
            counts = dict(s.execute(select(t.Series.node, func.count()).group_by(t.Series.node)).all())
            return [(n, health.get(n.name, []), int(counts.get(n.name, 0))) for n in nodes]

    def node(self, name: str) -> tuple[t.Node, list[t.CollectorStatus], int]:
        with self.sessions() as s:
            n = s.get(t.Node, name)
            if n is None:
                raise NotFound(f"node {name!r} has never sent a batch")
            health = list(
                s.scalars(
                    select(t.CollectorStatus)
                    .where(t.CollectorStatus.node == name)
                    .order_by(t.CollectorStatus.collector)
                )
            )
            count = int(s.scalar(select(func.count()).select_from(t.Series).where(t.Series.node == name)) or 0)
            return n, health, count

    def collector_status(self) -> list[t.CollectorStatus]:
        with self.sessions() as s:
            return list(s.scalars(select(t.CollectorStatus).order_by(t.CollectorStatus.node)))

    def series_count(self) -> int:
        with self.sessions() as s:
            return int(s.scalar(select(func.count()).select_from(t.Series)) or 0)

    # ---- incidents ----------------------------------------------------------------------------

    def upsert_incident(self, inc: Incident, now: float) -> tuple[int, str]:
        """Store the engine's view of ``inc`` (keyed by ``inc.key``); returns (id, transition).

        transition: ``opened``, ``updated``, ``resolved`` or ``reopened``. An engineer's ack is kept
        while the incident stays open; the timeline only grows.
        """
        with self._write_lock, self.sessions.begin() as s:
            row = s.scalars(select(t.Incident).where(t.Incident.key == inc.key)).first()
            if row is None:
                row = t.Incident(
                    key=inc.key, state=inc.state.value, acked_by=None, acked_ts=None, resolved_by=None, timeline=[]
                )
                s.add(row)
                transition = "opened"
            else:
                transition = self._transition(row.state, inc.state.value)
            _apply_incident(row, inc, transition, now)
            s.flush()
            return row.id, transition

    @staticmethod
    def _transition(old: str, new: str) -> str:
        if new == "resolved":
            return "updated" if old == "resolved" else "resolved"
        return "reopened" if old == "resolved" else "updated"

    def list_incidents(
        self, state: str | None = None, kind: str | None = None, since: float | None = None, limit: int = 100
    ) -> list[t.Incident]:
        q = select(t.Incident).order_by(t.Incident.started_ts.desc(), t.Incident.id.desc()).limit(limit)
        if state is not None:
            q = q.where(t.Incident.state == state)
        if kind is not None:
            q = q.where(t.Incident.kind == kind)
        if since is not None:
            q = q.where(t.Incident.updated_ts >= since)
        with self.sessions() as s:
            return list(s.scalars(q))

    def get_incident(self, incident_id: int) -> t.Incident:
        with self.sessions() as s:
            row = s.get(t.Incident, incident_id)
            if row is None:
                raise NotFound(f"incident {incident_id} does not exist")
            return row

    def ack(self, incident_id: int, by: str, now: float, note: str = "") -> t.Incident:
        with self._write_lock, self.sessions.begin() as s:
            row = s.get(t.Incident, incident_id)
            if row is None:
                raise NotFound(f"incident {incident_id} does not exist")
            if row.state == "resolved":
                raise Conflict(f"incident {incident_id} is already resolved; nothing to acknowledge")
            if row.state != "acked":
                row.state, row.acked_by, row.acked_ts = "acked", by, now
                row.timeline = [*row.timeline, [now, _with_note("acknowledged", note), by]]
            return row

    def resolve(self, incident_id: int, by: str, now: float, note: str = "") -> t.Incident:
        with self._write_lock, self.sessions.begin() as s:
            row = s.get(t.Incident, incident_id)
            if row is None:
                raise NotFound(f"incident {incident_id} does not exist")
            if row.state != "resolved":
                row.state, row.resolved_by, row.resolved_ts = "resolved", by, now
                row.timeline = [*row.timeline, [now, _with_note("resolved by an engineer", note), by]]
            return row

    def open_incident_counts(self) -> list[tuple[str, str, str, int]]:
        """(kind, severity, state, count) over incidents that are not resolved."""
        q = (
            select(t.Incident.kind, t.Incident.severity, t.Incident.state, func.count())
            .where(t.Incident.state != "resolved")
            .group_by(t.Incident.kind, t.Incident.severity, t.Incident.state)
        )
        with self.sessions() as s:
            return [(k, sev, st, int(n)) for k, sev, st, n in s.execute(q)]

    # ---- tokens -------------------------------------------------------------------------------

    def create_token(self, role: str, now: float, node: str | None = None, note: str = "") -> tuple[int, str]:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._write_lock, self.sessions.begin() as s:
            row = t.Token(digest=token_digest(token), role=role, node=node or None, note=note, created_ts=now)
            s.add(row)
            s.flush()
            return row.id, token

    def find_token(self, token: str) -> TokenInfo | None:
        digest = token_digest(token)
        with self.sessions() as s:
            row = s.scalars(select(t.Token).where(t.Token.digest == digest)).first()
            if row is None or not hmac.compare_digest(row.digest, digest) or row.revoked_ts is not None:
                return None
            return _token_info(row)

    def revoke_token(self, id_or_token: str, now: float) -> TokenInfo:
        cond = (
            (t.Token.id == int(id_or_token)) if id_or_token.isdigit() else (t.Token.digest == token_digest(id_or_token))
        )
        with self._write_lock, self.sessions.begin() as s:
            row = s.scalars(select(t.Token).where(cond)).first()
            if row is None:
                raise NotFound("no such token (give its id from `fabricd token list`, or the token itself)")
            if row.revoked_ts is None:
                row.revoked_ts = now
            return _token_info(row)

    def list_tokens(self) -> list[TokenInfo]:
        with self.sessions() as s:
            return [_token_info(r) for r in s.scalars(select(t.Token).order_by(t.Token.id))]

    def has_admin_token(self) -> bool:
        q = select(t.Token.id).where(t.Token.role == "admin", t.Token.revoked_ts.is_(None)).limit(1)
        with self.sessions() as s:
            return s.execute(q).first() is not None

    # ---- topology -----------------------------------------------------------------------------

    def put_topology(self, doc: dict[str, Any], now: float, name: str = "default") -> None:
        with self._write_lock, self.sessions.begin() as s:
            row = s.get(t.Topology, name)
            if row is None:
                s.add(t.Topology(name=name, updated_ts=now, doc=doc))
            else:
                row.doc, row.updated_ts = doc, now

    def get_topology(self, name: str = "default") -> t.Topology:
        with self.sessions() as s:
            row = s.get(t.Topology, name)
            if row is None:
                raise NotFound(f"no topology named {name!r} has been uploaded (PUT /api/v1/topology)")
            return row

    # ---- maintenance --------------------------------------------------------------------------

    def maintain(self, now: float, raw_retention: float, step: float, retention: float) -> MaintenanceReport:
        """Downsample raw points older than ``raw_retention`` into ``step`` buckets; drop past ``retention``.

        Only whole buckets are folded (the cutoff is aligned down to ``step``), so running this
        twice never writes two points for one bucket.
        """
        cutoff = (now - raw_retention) // step * step
        folded = written = 0
        for sid, kind in self._series_with_raw_before(cutoff):
            n, w = self._downsample_series(sid, kind, cutoff, step)
            folded, written = folded + n, written + w
        with self._write_lock, self.engine.begin() as conn:
            dp = conn.execute(delete(t.Point).where(t.Point.ts < now - retention)).rowcount
            db = conn.execute(delete(t.IngestedBatch).where(t.IngestedBatch.received_ts < now - retention)).rowcount
        return MaintenanceReport(folded, written, int(dp or 0), int(db or 0))

    def _series_with_raw_before(self, cutoff: float) -> list[tuple[int, str]]:
        q = (
            select(t.Point.series_id, t.Series.kind)
            .join(t.Series, t.Series.id == t.Point.series_id)
            .where(t.Point.step == 0.0, t.Point.ts < cutoff)
            .distinct()
        )
        with self.sessions() as s:
            return [(int(a), str(b)) for a, b in s.execute(q)]

    def _downsample_series(self, sid: int, kind: str, cutoff: float, step: float) -> tuple[int, int]:
        with self._write_lock, self.engine.begin() as conn:
            q = (
                select(t.Point.ts, t.Point.value, t.Point.rate, t.Point.status)
                .where(t.Point.series_id == sid, t.Point.step == 0.0, t.Point.ts < cutoff)
                .order_by(t.Point.ts)
            )
            raw = conn.execute(q).all()
            buckets = downsample(raw, step, counter=kind == Kind.COUNTER.value)
            conn.execute(delete(t.Point).where(t.Point.series_id == sid, t.Point.step == 0.0, t.Point.ts < cutoff))
            if buckets:
                conn.execute(insert(t.Point), [{"series_id": sid, "step": step, "since": None, **b} for b in buckets])
            return len(raw), len(buckets)


def downsample(
    raw: Sequence[tuple[float, float, float | None, str]], step: float, counter: bool
) -> list[dict[str, Any]]:
    """Fold (ts, value, rate, status) points into ``step``-wide buckets (pure, for tests).

    A bucket keeps its start time, the mean of the honest rates (None when there were none), and
    the last value for counters (a cumulative total) or the mean value for gauges.
    """
    groups: dict[float, list[tuple[float, float, float | None, str]]] = {}
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


# ---- ingest helpers (module level: the hot loops avoid attribute lookups on self) --------------

# Status by its stored text: a dict hit instead of ``Status(text)``'s EnumType.__call__.
_STATUSES: dict[str, Status] = {st.value: st for st in Status}
IdentityKey = tuple[str, str, str, str, Labels]  # source, device, port, counter, labels: one node's series
PointRow = tuple[int, float, float, float | None, str, float | None]  # series_id, ts, value, rate, status, since


@dataclass(slots=True)
class _Job:
    """A batch waiting for a group commit, and its outcome once ``done``."""

    batch: Batch
    now: float
    limit: int
    done: bool = False
    result: IngestResult | None = None
    error: BaseException | None = None
    latest: list[PointRow] = field(default_factory=list)  # the stored points, for _Latest after commit
    last_point_id: int = 0  # id of the batch's last point (its points' ids are consecutive)


@dataclass(slots=True)
class _NodeSeries:
    """One node's series ids by identity, and how many series the node has in the table.

    The labels part of the key is the reading's own tuple; a tuple that is not sorted is added as an
    alias of the sorted one (``_alias``), so ``count`` and not ``len(ids)`` is the series count."""

    ids: dict[IdentityKey, int]
    count: int


LATEST_CURSOR = "latest"  # cursors row: every raw point up to here has its latest value in the table


class _Latest:
    """The newest point of every series, by node, in memory; ``latest_*`` in the series table is its
    durable copy, written by ``Store.flush_latest``.

    Updating one series row per stored point made ingest pay a second, random write per point: on
    SQLite 2.2 of 5.8 us a point, on PostgreSQL 15 of 23 us (no HOT update fits in packed series
    pages, so each update writes all three of its indexes), measured in docs/storage.md. A flush
    every ``latest_flush_seconds`` writes each changed series once, in large statements, off the
    ingest transaction. The newest point wins, as the old ``latest_ts <= v.ts`` condition: a spooled
    backlog drained after live data never replaces a newer value. All methods are thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_node: dict[str, dict[int, PointRow]] = {}
        self._dirty: dict[int, PointRow] = {}  # changed since the last flush
        self.loaded = False
        self.flushed_upto = 0  # the point id cursor as of the last flush or load

    def apply(self, node: str, rows: Sequence[PointRow], dirty: bool = True) -> None:
        with self._lock:
            mine = self._by_node.get(node)
            if mine is None:
                mine = self._by_node[node] = {}
            changed = self._dirty
            for row in rows:
                old = mine.get(row[0])
                if old is None or old[1] <= row[1]:  # on a tie the later point wins, as the table did
                    mine[row[0]] = row
                    if dirty:
                        changed[row[0]] = row

    def load(self, cur: Any, sql: _IngestSql) -> None:
        cur.execute(sql.read_cursor, (LATEST_CURSOR,))
        found = cur.fetchone()
        upto = int(found[0]) if found else 0
        cur.execute(sql.table_latest)
        for node, group in _by_node(cur):
            self.apply(node, group, dirty=False)
        cur.execute(sql.replay_latest, (upto,))  # stored after the last flush: a crash, or a kill -9
        for node, group in _by_node(cur):
            self.apply(node, group)
        self.flushed_upto = upto
        self.loaded = True

    def rows(self, node: str | None, fresh_since: float | None) -> list[PointRow]:
        with self._lock:
            nodes = [node] if node is not None else sorted(self._by_node)
            out: list[PointRow] = []
            for name in nodes:
                mine = self._by_node.get(name, {})
                picked = mine.values() if fresh_since is None else [r for r in mine.values() if r[1] >= fresh_since]
                out.extend(sorted(picked))  # by series id (ids are unique: the tuples never compare further)
            return out

    def get(self, node: str, sid: int) -> PointRow | None:
        with self._lock:
            return self._by_node.get(node, {}).get(sid)

    def take_dirty(self) -> dict[int, PointRow]:
        with self._lock:
            dirty, self._dirty = self._dirty, {}
            return dirty

    def restore_dirty(self, rows: dict[int, PointRow]) -> None:
        with self._lock:
            for sid, row in rows.items():
                newer = self._dirty.get(sid)
                if newer is None or newer[1] < row[1]:
                    self._dirty[sid] = row

    def pending(self) -> int:
        with self._lock:
            return len(self._dirty)


class _Tail:
    """The raw points of the last batches stored, by point id, for the detection stream.

    The detection loop reads every point ingest stores, right after it is stored; reading them
    back cost as much as storing them (docs/storage.md). Batches are appended after their commit,
    in commit order (under the write lock), so the tail holds every raw point with an id above
    ``floor``; older entries are dropped past ``max_points`` and ``floor`` moves up with them.
    ``since`` answers only when it can answer exactly what the database would: the same points in
    id order (a batch's ids are consecutive, so a cursor inside a batch skips its first points).
    """

    def __init__(self, floor: int, max_points: int) -> None:
        self._lock = threading.Lock()
        self._entries: deque[tuple[int, int, Sequence[PointRow]]] = deque()  # first id, last id, rows
        self._points = 0
        self.floor, self.max_points = floor, max_points

    def append(self, last_id: int, rows: Sequence[PointRow]) -> None:
        with self._lock:
            self._entries.append((last_id - len(rows) + 1, last_id, rows))
            self._points += len(rows)
            while self._points > self.max_points and len(self._entries) > 1:
                _first, last, old = self._entries.popleft()
                self._points -= len(old)
                self.floor = last

    def since(self, cursor: int, limit: int) -> tuple[list[tuple[Any, ...]], int] | None:
        """(point rows as ``read_points`` returns them, next cursor), or None to read the database."""
        with self._lock:
            if cursor < self.floor:
                return None
            out: list[tuple[Any, ...]] = []
            upto = cursor
            for first, last, rows in self._entries:
                if last <= cursor:
                    continue
                skip = max(0, cursor - first + 1)
                take = rows[skip : skip + limit - len(out)]
                out.extend((first + skip + i, *row) for i, row in enumerate(take))
                upto = first + skip + len(take) - 1
                if len(out) >= limit:
                    break
            return out, upto


def _by_node(cur: Any, size: int = 10_000) -> Iterator[tuple[str, list[PointRow]]]:
    """(node, rows) from a cursor of (node, series id, ts, value, rate, status, since), in chunks."""
    while chunk := cur.fetchmany(size):
        groups: dict[str, list[PointRow]] = {}
        for node, *row in chunk:
            groups.setdefault(node, []).append(tuple(row))
        yield from groups.items()


class _ManyRows:
    """One statement for many rows (``VALUES (..), (..), ..``), run in power-of-two sized chunks.

    Python's sqlite3 releases the GIL around every ``sqlite3_step``, so an executemany of 500 rows
    gives the GIL away 500 times, and under concurrent requests (decoding, the event loop) the writer
    can wait up to the switch interval (5 ms) each time to get it back: measured, the server stored
    points 3x slower than the same executemany in a quiet process. One statement per chunk steps
    once. Power-of-two sizes keep the distinct statement texts few, so each is prepared once and
    then found in the driver's statement cache (sqlite3's ``cached_statements``, psycopg's
    ``prepare_threshold``). 512 rows x 7 parameters stays far below both drivers' parameter limits.
    """

    MAX_ROWS = 512

    def __init__(self, template: str, row: str) -> None:
        self.template, self.row = template, row
        self._texts: dict[int, str] = {}

    def text(self, rows: int) -> str:
        sql = self._texts.get(rows)
        if sql is None:
            sql = self._texts[rows] = self.template.format(values=", ".join([self.row] * rows))
        return sql

    def run(self, cur: Any, rows: Sequence[tuple[Any, ...]]) -> None:
        start, n = 0, len(rows)
        while start < n:
            size = min(self.MAX_ROWS, 1 << ((n - start).bit_length() - 1))
            cur.execute(self.text(size), [x for row in rows[start : start + size] for x in row])
            start += size


class _ArrayRows:
    """PostgreSQL: one statement for all rows, one array parameter per column (``unnest``).

    psycopg parses every query text longer than 4 KiB again on each execute (its query cache
    skips long texts), which made ``_ManyRows``' 512-row VALUES slower than executemany there;
    arrays keep the text short and constant, and psycopg dumps each list in C.
    """

    def __init__(self, sql: str) -> None:
        self.sql = sql

    def run(self, cur: Any, rows: Sequence[tuple[Any, ...]]) -> None:
        if rows:
            cur.execute(self.sql, [list(column) for column in zip(*rows, strict=True)])


@dataclass(frozen=True, slots=True)
class _IngestSql:
    """Ingest's statements in the driver's placeholder style, run on the raw DBAPI cursor.

    SQLAlchemy's per-statement and per-row work costs more than SQLite's own at tens of thousands of
    points per second (bench/run.py). ``ON CONFLICT`` (SQLite >= 3.24, PostgreSQL >= 9.5) makes the
    batch-id check, the node and the collector health one statement each; the unique
    (node, batch id) makes a retried batch a no-op. ``UPDATE .. FROM`` needs SQLite >= 3.33.
    """

    mark: str
    claim_batch: str
    upsert_node: str
    upsert_health: str
    insert_series: str
    node_series: str
    insert_points: _ManyRows | _ArrayRows
    update_latest: _ManyRows | _ArrayRows
    read_points: str
    series_identity: str  # {ids}: the id condition
    upsert_cursor: str
    last_point_id: str
    read_cursor: str
    table_latest: str
    replay_latest: str

    @classmethod
    def for_marker(cls, m: str) -> _IngestSql:
        def marks(n: int) -> str:
            return ", ".join([m] * n)

        bulk = _bulk_statements_postgres() if m == "%s" else _bulk_statements_sqlite()
        return cls(
            mark=m,
            claim_batch=f"INSERT INTO ingested_batches (node, batch_id, received_ts, samples) VALUES ({marks(4)}) "
            "ON CONFLICT (node, batch_id) DO NOTHING",
            upsert_node="INSERT INTO nodes (name, agent_version, first_seen, last_seen, last_batch_ts, batches, "
            f"samples) VALUES ({marks(5)}, 1, {m}) ON CONFLICT (name) DO UPDATE SET "
            "agent_version = excluded.agent_version, last_seen = excluded.last_seen, "
            "last_batch_ts = excluded.last_batch_ts, batches = nodes.batches + 1, "
            "samples = nodes.samples + excluded.samples",
            upsert_health="INSERT INTO collector_status (node, collector, success, duration_seconds, ts, error, "
            f"readings) VALUES ({marks(7)}) ON CONFLICT (node, collector) DO UPDATE SET "
            "success = excluded.success, duration_seconds = excluded.duration_seconds, ts = excluded.ts, "
            "error = excluded.error, readings = excluded.readings",
            insert_series="INSERT INTO series (node, source, device, port, counter, labels, name, unit, kind) "
            f"VALUES ({marks(9)}) ON CONFLICT (node, source, device, port, counter, labels) DO NOTHING",
            node_series=f"SELECT id, source, device, port, counter, labels FROM series WHERE node = {m}",
            insert_points=bulk[0],
            update_latest=bulk[1],
            read_points=f"SELECT id, series_id, ts, value, rate, status, since FROM points WHERE id > {m} "
            f"AND step = 0.0 ORDER BY id LIMIT {m}",
            series_identity="SELECT id, node, source, device, port, counter, name, unit, kind, labels FROM series "
            "WHERE id {ids}",
            upsert_cursor=f"INSERT INTO cursors (name, position) VALUES ({m}, {m}) "
            "ON CONFLICT (name) DO UPDATE SET position = excluded.position",
            read_cursor=f"SELECT position FROM cursors WHERE name = {m}",
            # This connection's last generated id; the write lock makes a batch's ids consecutive.
            last_point_id="SELECT lastval()" if m == "%s" else "SELECT last_insert_rowid()",
            table_latest="SELECT node, id, latest_ts, latest_value, latest_rate, latest_status, latest_since "
            "FROM series WHERE latest_ts IS NOT NULL AND latest_value IS NOT NULL",
            replay_latest="SELECT s.node, p.series_id, p.ts, p.value, p.rate, p.status, p.since FROM points p "
            f"JOIN series s ON s.id = p.series_id WHERE p.id > {m} AND p.step = 0.0 ORDER BY p.id",
        )


# Columns of a point row (PointRow) and the condition that keeps a newer latest value: a spooled
# backlog drains after live data, and an old point must never replace a newer latest.
_POINT_COLUMNS = "series_id, ts, value, rate, status, since, step"
_SET_LATEST = (
    "UPDATE series SET latest_ts = v.ts, latest_value = v.value, latest_rate = v.rate, latest_status = v.status, "
    "latest_since = v.since FROM {source} WHERE series.id = v.id AND (series.latest_ts IS NULL OR series.latest_ts <= v.ts)"
)


def _bulk_statements_sqlite() -> tuple[_ManyRows, _ManyRows]:
    """Points and latest values for sqlite3 (``UPDATE .. FROM`` needs SQLite >= 3.33)."""
    return (
        _ManyRows(f"INSERT INTO points ({_POINT_COLUMNS}) VALUES {{values}}", "(?, ?, ?, ?, ?, ?, 0.0)"),
        _ManyRows(
            "WITH v (id, ts, value, rate, status, since) AS (VALUES {values}) " + _SET_LATEST.format(source="v"),
            "(?, ?, ?, ?, ?, ?)",
        ),
    )


def _bulk_statements_postgres() -> tuple[_ArrayRows, _ArrayRows]:
    # %b: binary parameters; psycopg dumps a list in text form element by element with a regex.
    arrays = "unnest(%b::bigint[], %b::float8[], %b::float8[], %b::float8[], %b::text[], %b::float8[])"
    return (
        _ArrayRows(f"INSERT INTO points ({_POINT_COLUMNS}) SELECT v.*, 0.0 FROM {arrays} AS v"),
        _ArrayRows(_SET_LATEST.format(source=f"{arrays} AS v (id, ts, value, rate, status, since)")),
    )


def _identity_reading(
    source: str, device: str, port: str, counter: str, name: str, unit: str, kind: str, labels: str
) -> Reading:
    # Interned: a fleet repeats the same few hundred names on every node, so the cache stays small.
    i = sys.intern
    return Reading(
        i(source), i(device), i(port), i(counter), 0.0, i(unit), Kind(kind), _labels_of_json(labels), i(name)
    )


def _samples_of(rows: Sequence[Any], idents: dict[int, tuple[str, Reading]]) -> list[tuple[str, Sample]]:
    """(node, sample) of each (id, series_id, ts, value, rate, status, since) point row."""
    out: list[tuple[str, Sample]] = []
    append, statuses = out.append, _STATUSES
    for _pid, sid, ts, value, rate, status, since in rows:
        ident = idents.get(sid)
        if ident is None:  # a point of a series that does not exist (no foreign key): as the old inner join
            continue
        node, b = ident
        r = Reading(b.source, b.device, b.port, b.counter, value, b.unit, b.kind, b.labels, b.name)
        append((node, Sample(ts, r, rate, statuses.get(status) or Status(status), since)))
    return out


def _latest_samples(rows: Sequence[Any], idents: dict[int, tuple[str, Reading]]) -> list[tuple[str, Sample]]:
    """(node, sample) of each (series id, ts, value, rate, status, since) ``series.latest_*`` row."""
    out: list[tuple[str, Sample]] = []
    append, statuses = out.append, _STATUSES
    for sid, ts, value, rate, status, since in rows:
        node, b = idents[sid]
        r = Reading(b.source, b.device, b.port, b.counter, value, b.unit, b.kind, b.labels, b.name)
        append((node, Sample(ts, r, rate, statuses.get(status or "ok") or Status(status), since)))
    return out


def _labels_of_json(text: str) -> Labels:
    return tuple(sorted(json.loads(text).items())) if text != "{}" else ()


def _alias(ids: dict[IdentityKey, int], r: Reading) -> bool:
    """Map an unsorted (or repeated-key) label tuple to its stored series, if there is one."""
    canonical = tuple(sorted(dict(r.labels).items()))
    sid = ids.get((r.source, r.device, r.port, r.counter, canonical))
    if sid is None:
        return False
    ids[(r.source, r.device, r.port, r.counter, r.labels)] = sid
    return True


def _series_ids(samples: Sequence[Sample], ids: dict[IdentityKey, int]) -> list[int | None]:
    get = ids.get
    return [get((r.source, r.device, r.port, r.counter, r.labels)) for s in samples for r in [s.reading]]


def _point_rows(samples: Sequence[Sample], sids: list[int]) -> list[PointRow]:
    # ``_value_``: the enum's plain str (``.value`` is a descriptor call, several times slower).
    return [
        (sid, s.ts, s.reading.value, s.rate, s.status._value_, s.since) for sid, s in zip(sids, samples, strict=True)
    ]


def _health_rows(node: str, health: Sequence[CollectorHealth]) -> list[tuple[Any, ...]]:
    """One row per collector: its newest report in the batch."""
    latest: dict[str, CollectorHealth] = {}
    for h in health:
        if h.collector not in latest or h.ts >= latest[h.collector].ts:
            latest[h.collector] = h
    return [
        (node, h.collector, h.success, h.duration_seconds, h.ts, h.error[:2000], h.readings) for h in latest.values()
    ]


def _with_note(text: str, note: str) -> str:
    return f"{text}: {note}" if note else text


def _token_info(row: t.Token) -> TokenInfo:
    return TokenInfo(row.id, row.role, row.node, row.note, row.created_ts, row.revoked_ts)


def _apply_incident(row: t.Incident, inc: Incident, transition: str, now: float) -> None:
    row.kind, row.severity, row.element, row.summary = inc.kind.value, inc.severity.value, inc.element, inc.summary
    row.started_ts = row.started_ts if row.started_ts is not None and transition != "reopened" else inc.started_ts
    row.updated_ts = inc.updated_ts
    row.candidates = [{"element": c.element, "score": c.score} for c in inc.candidates]
    row.affected = list(inc.affected)
    row.evidence = [_evidence_json(e) for e in inc.evidence]
    if transition == "resolved":
        row.state, row.resolved_ts, row.resolved_by = "resolved", inc.resolved_ts or inc.updated_ts, "detector"
    elif transition in ("opened", "reopened"):
        row.state, row.resolved_ts, row.resolved_by, row.acked_by, row.acked_ts = "open", None, None, None, None
    seen = {(e[0], e[1]) for e in row.timeline}
    added = [[ts, text, "detector"] for ts, text in inc.timeline if (ts, text) not in seen]
    if transition != "updated":
        added.append(
            [inc.updated_ts if transition != "opened" else inc.started_ts, f"{transition}: {inc.summary}", "detector"]
        )
    if added:
        row.timeline = sorted([*row.timeline, *added], key=lambda e: e[0])


def _evidence_json(e: Any) -> dict[str, Any]:
    return {
        "signal": e.signal,
        "node": e.node,
        "device": e.device,
        "port": e.port,
        "value": e.value,
        "threshold": e.threshold,
        "ts": e.ts,
        "labels": dict(e.labels),
        "note": e.note,
    }
