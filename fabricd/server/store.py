"""The storage API: everything the service reads and writes goes through ``Store``.

One ``Store`` per process owns the engine and a write lock. Writes are serialized by that lock so
SQLite never sees two writers (which would fail with "database is locked" instead of queueing) and
so ``points.id`` order is commit order on every backend: the detection engine's cursor
(``read_samples_since``) can then never skip a point committed late with a smaller id.
Batch ingest is one transaction: the batch id row, node, collector health, new series and every
point commit together or not at all, so a retried batch is a no-op and a crash cannot half-store.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from fabricd.model import Batch, CollectorHealth, Incident, Kind, Reading, Sample, Status
from fabricd.server import tables as t

SeriesKey = tuple[str, str, str, str, str, str]  # node, source, device, port, counter, labels JSON
TOKEN_PREFIX = "fabricd_"
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


def _mark(conn: Connection) -> str:
    """The DBAPI placeholder: ``?`` for sqlite3, ``%s`` for psycopg."""
    return "?" if conn.dialect.paramstyle == "qmark" else "%s"


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
        self._series_ids: dict[SeriesKey, int] = {}
        self._series_count: dict[str, int] = {}

    # ---- ingest -------------------------------------------------------------------------------

    def ingest(self, batch: Batch, now: float, max_series_per_node: int) -> IngestResult:
        with self._write_lock:
            try:
                with self.engine.begin() as conn:
                    if self._seen(conn, batch):
                        return IngestResult(batch.batch_id, 0, True)
                    conn.execute(
                        insert(t.IngestedBatch).values(
                            node=batch.node, batch_id=batch.batch_id, received_ts=now, samples=len(batch.samples)
                        )
                    )
                    self._upsert_node(conn, batch, now)
                    self._upsert_health(conn, batch.node, batch.health)
                    ids, new = self._resolve_series(conn, batch, max_series_per_node)
                    self._insert_points(conn, batch.samples, ids, batch.node)
            except IntegrityError:
                # Another request stored the same batch id first (a retry racing its original).
                return IngestResult(batch.batch_id, 0, True)
            self._remember(batch.node, new)
            return IngestResult(batch.batch_id, len(batch.samples), False, len(new))

    def _seen(self, conn: Connection, batch: Batch) -> bool:
        q = select(t.IngestedBatch.id).where(
            t.IngestedBatch.node == batch.node, t.IngestedBatch.batch_id == batch.batch_id
        )
        return conn.execute(q).first() is not None

    def _upsert_node(self, conn: Connection, batch: Batch, now: float) -> None:
        n = len(batch.samples)
        res = conn.execute(
            update(t.Node)
            .where(t.Node.name == batch.node)
            .values(
                agent_version=batch.agent_version,
                last_seen=now,
                last_batch_ts=batch.created_ts,
                batches=t.Node.batches + 1,
                samples=t.Node.samples + n,
            )
        )
        if res.rowcount == 0:
            conn.execute(
                insert(t.Node).values(
                    name=batch.node,
                    agent_version=batch.agent_version,
                    first_seen=now,
                    last_seen=now,
                    last_batch_ts=batch.created_ts,
                    batches=1,
                    samples=n,
                )
            )

    def _upsert_health(self, conn: Connection, node: str, health: Sequence[CollectorHealth]) -> None:
        latest: dict[str, CollectorHealth] = {}
        for h in health:
            if h.collector not in latest or h.ts >= latest[h.collector].ts:
                latest[h.collector] = h
        if not latest:
            return
        names = list(latest)
        conn.execute(
            delete(t.CollectorStatus).where(t.CollectorStatus.node == node, t.CollectorStatus.collector.in_(names))
        )
        conn.execute(
            insert(t.CollectorStatus),
            [
                {
                    "node": node,
                    "collector": h.collector,
                    "success": h.success,
                    "duration_seconds": h.duration_seconds,
                    "ts": h.ts,
                    "error": h.error[:2000],
                    "readings": h.readings,
                }
                for h in latest.values()
            ],
        )

    def _load_node_series(self, conn: Connection, node: str) -> None:
        if node in self._series_count:
            return
        q = select(
            t.Series.id, t.Series.source, t.Series.device, t.Series.port, t.Series.counter, t.Series.labels
        ).where(t.Series.node == node)
        rows = conn.execute(q).all()
        for sid, source, device, port, counter, labels in rows:
            self._series_ids[(node, source, device, port, counter, labels)] = sid
        self._series_count[node] = len(rows)

    def _resolve_series(
        self, conn: Connection, batch: Batch, limit: int
    ) -> tuple[dict[SeriesKey, int], dict[SeriesKey, int]]:
        """Ids for every series in the batch; new ones are inserted (the limit checked first)."""
        self._load_node_series(conn, batch.node)
        wanted: dict[SeriesKey, Reading] = {}
        for s in batch.samples:
            wanted.setdefault(series_key(batch.node, s.reading), s.reading)
        ids = {k: self._series_ids[k] for k in wanted if k in self._series_ids}
        fresh = [k for k in wanted if k not in ids]
        if not fresh:
            return ids, {}
        existing = self._series_count[batch.node]
        if existing + len(fresh) > limit:
            raise SeriesLimitExceeded(batch.node, limit, existing, len(fresh))
        rows = [
            {
                "node": k[0],
                "source": k[1],
                "device": k[2],
                "port": k[3],
                "counter": k[4],
                "labels": k[5],
                "name": wanted[k].metric,
                "unit": wanted[k].unit,
                "kind": wanted[k].kind.value,
            }
            for k in fresh
        ]
        stmt = insert(t.Series).returning(t.Series.id, sort_by_parameter_order=True)
        new_ids = [row[0] for row in conn.execute(stmt, rows)]
        new = dict(zip(fresh, new_ids, strict=True))
        ids.update(new)
        return ids, new

    def _remember(self, node: str, new: dict[SeriesKey, int]) -> None:
        # Only after commit: a rolled-back insert must not leave ids that do not exist in the cache.
        self._series_ids.update(new)
        self._series_count[node] = self._series_count.get(node, 0) + len(new)

    def _insert_points(self, conn: Connection, samples: Sequence[Sample], ids: dict[SeriesKey, int], node: str) -> None:
        """One DBAPI executemany with positional rows: SQLAlchemy's per-row parameter processing
        costs more than SQLite's insert itself at tens of thousands of points per second."""
        if not samples:
            return
        rows: list[tuple[Any, ...]] = []
        latest: dict[int, Sample] = {}
        for s in samples:
            sid = ids[series_key(node, s.reading)]
            rows.append((sid, s.ts, s.reading.value, s.rate, s.status.value, s.since))
            if sid not in latest or s.ts >= latest[sid].ts:
                latest[sid] = s
        mark = _mark(conn)
        conn.exec_driver_sql(
            f"INSERT INTO points (series_id, ts, value, rate, status, since, step) VALUES "
            f"({', '.join([mark] * 6)}, 0.0)",
            rows,
        )
        self._update_latest(conn, latest)

    def _update_latest(self, conn: Connection, latest: dict[int, Sample]) -> None:
        # A spooled backlog drains after live data: never let an old point replace a newer latest.
        m = _mark(conn)
        conn.exec_driver_sql(
            f"UPDATE series SET latest_ts = {m}, latest_value = {m}, latest_rate = {m}, latest_status = {m}, "
            f"latest_since = {m} WHERE id = {m} AND (latest_ts IS NULL OR latest_ts <= {m})",
            [(x.ts, x.reading.value, x.rate, x.status.value, x.since, sid, x.ts) for sid, x in latest.items()],
        )

    # ---- detection stream ---------------------------------------------------------------------

    def read_samples_since(self, cursor: int, limit: int = 20_000) -> tuple[list[tuple[str, Sample]], int]:
        """Raw samples stored after ``cursor`` in ingest order, and the cursor to pass next time."""
        q = (
            select(t.Point.id, t.Point.ts, t.Point.value, t.Point.rate, t.Point.status, t.Point.since, t.Series)
            .join(t.Series, t.Series.id == t.Point.series_id)
            .where(t.Point.id > cursor, t.Point.step == 0.0)
            .order_by(t.Point.id)
            .limit(limit)
        )
        out: list[tuple[str, Sample]] = []
        readings: dict[int, Reading] = {}
        with self.sessions() as s:
            for pid, ts, value, rate, status, since, row in s.execute(q):
                base = readings.get(row.id) or readings.setdefault(row.id, _reading_of(row))
                r = Reading(
                    base.source,
                    base.device,
                    base.port,
                    base.counter,
                    value,
                    base.unit,
                    base.kind,
                    base.labels,
                    base.name,
                )
                out.append((row.node, Sample(ts=ts, reading=r, rate=rate, status=Status(status), since=since)))
                cursor = pid
        return out, cursor

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
        """The latest sample of each series (optionally of one node/source, seen since a time)."""
        q = select(t.Series).where(t.Series.latest_ts.is_not(None)).order_by(t.Series.node, t.Series.id)
        if node is not None:
            q = q.where(t.Series.node == node)
        if source is not None:
            q = q.where(t.Series.source == source)
        if fresh_since is not None:
            q = q.where(t.Series.latest_ts >= fresh_since)
        out: list[tuple[str, Sample]] = []
        with self.sessions() as s:
            for row in s.scalars(q):
                sample = _latest_of(row, _reading_of(row))
                if sample is not None:
                    out.append((row.node, sample))
        return out

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
        with self.sessions() as s:
            return [SeriesInfo(row.id, row.node, (r := _reading_of(row)), _latest_of(row, r)) for row in s.scalars(q)]

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
