"""The storage layer: detection stream, incidents, maintenance, migrations; SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from fabricd.detect.engine import DetectionEngine
from fabricd.model import Batch, Incident, IncidentKind, IncidentState, Kind, Reading, Sample, Severity, Status
from fabricd.server import db
from fabricd.server.detection import DetectionLoop, EngineFeed, keep_for
from fabricd.server.metrics import ServerMetrics
from fabricd.server.store import chunks, partitions
from fabricd.server.store.identities import Identities
from fabricd.server.store.maintenance import downsample
from fabricd.server.store.records import Committed, Delivery, IngestResult, Keep, SeriesLimitExceeded
from fabricd.server.store.storage import Storage
from fabricd.server.tables import Base
from tests.helpers import skip_or_fail
from tests.support.detectors import ImmediateDetector
from tests.support.points import raw_points, written_latest
from tests.support.server import backend_url, ib_sample, make_batch, pg_reachable

T0 = 1_800_000_000.0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    if request.param == "postgres" and not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    with backend_url(request.param, tmp_path) as url:
        engine = db.make_engine(url)
        db.prepare(engine)
        # Half-hour partitions on PostgreSQL: the tests' hours of points span several.
        yield Storage.open(engine, partition_seconds=1800.0)
        engine.dispose()


def flat(read: tuple[list[Delivery], int]) -> tuple[list[tuple[str, Sample]], int]:
    """A stream read as (node, sample) pairs, as the detection loop hands them to the detector."""
    deliveries, cursor = read
    return [(d.node, s) for d in deliveries for s in d.samples], cursor


def test_migrations_create_exactly_the_table_models(store: Storage) -> None:
    with store.engine.connect() as conn:
        is_partitioned = conn.dialect.name == "postgresql" and partitions.is_partitioned(conn)
        children = set()
        if is_partitioned:
            for parent in (partitions.POINTS, partitions.CHUNKS):
                children |= {p.name for p in partitions.partitions(conn, parent)} | {parent.default}
        # The time partitions are tables of their own to the inspector, not models.
        context = MigrationContext.configure(conn, opts={"include_name": lambda name, kind, _p: name not in children})
        diffs = compare_metadata(context, Base.metadata)
    # PostgreSQL's partitioned tables differ from SQLite's on purpose (fabricd/server/store/partitions.py):
    # no (step, ts) index on points; the chunks' id is a BIGINT, and their indexes serve a
    # partition's reads by (node, id) and a series' history by (node, ts_min).
    pg = [
        ("add_index", "ix_point_chunks_node_ts"),
        ("add_index", "ix_point_chunks_ts"),
        ("add_index", "ix_points_step_ts"),
        ("modify_type", "point_chunks.id"),
        ("remove_index", "ix_point_chunks_node_id"),
        ("remove_index", "ix_point_chunks_node_ts"),
    ]
    flat = [d for diff in diffs for d in (diff if isinstance(diff, list) else [diff])]
    found = [(d[0], f"{d[2]}.{d[3]}" if d[0] == "modify_type" else d[1].name) for d in flat]
    assert sorted(found) == (sorted(pg) if is_partitioned else [])
    assert db.is_ready(store.engine) == (True, f"schema at revision {db.head_revision()}")


@pytest.mark.postgres
def test_the_latest_value_flush_rewrites_no_series_row_on_postgresql(tmp_path: Path) -> None:
    """The flush writes a packed row per node (migration 0009): the series rows stay where they are
    (no new row version, no index entry), and their pages are packed again (fillfactor reset)."""
    if not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    with backend_url("postgres", tmp_path) as url:
        engine = db.make_engine(url)
        try:
            db.prepare(engine)
            store = Storage.open(engine)
            pages = text("SELECT id, ctid::text, xmin::text FROM series ORDER BY id")
            store.writer.ingest(
                make_batch("n1", "a", [ib_sample(T0 + i, device=f"mlx5_{i}") for i in range(200)]), T0, 1000
            )
            with engine.connect() as conn:
                before = conn.execute(pages).all()
            store.writer.ingest(
                make_batch("n1", "b", [ib_sample(T0 + 10, device=f"mlx5_{i}") for i in range(200)]), T0, 1000
            )
            assert store.latest.flush() == 200
            with engine.connect() as conn:
                options = conn.execute(
                    text("SELECT reloptions FROM pg_class WHERE oid = 'series'::regclass")
                ).scalar_one()
                after = conn.execute(pages).all()
                written = written_latest(conn)
        finally:
            engine.dispose()
    assert after == before and options is None
    assert sorted(row[1] for row in written.values()) == [max(T0 + i, T0 + 10) for i in range(200)]


def test_a_newer_schema_is_refused_with_a_clear_message(store: Storage) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(db.SchemaError, match="revision 9999, newer than this fabricd knows"):
        db.prepare(store.engine)
    assert db.is_ready(store.engine)[0] is False


def test_detection_reads_the_stream_in_ingest_order_with_a_cursor(store: Storage) -> None:
    store.writer.ingest(make_batch("n1", "a", [ib_sample(T0 + 1), ib_sample(T0 + 2, device="mlx5_1")]), T0, 100)
    store.writer.ingest(make_batch("n2", "a", [ib_sample(T0 - 50)]), T0, 100)  # late (spooled) data: still next
    first, cursor = store.stream.read(0, limit=2)
    assert [(d.node, [s.reading.device for s in d.samples]) for d in first] == [("n1", ["mlx5_0", "mlx5_1"])]
    rest, cursor = store.stream.read(cursor)
    assert [(d.node, [s.ts for s in d.samples]) for d in rest] == [("n2", [T0 - 50])]
    assert rest[0].samples[0].reading.metric == "port_transmit_data" and rest[0].samples[0].rate == 1e9
    assert store.stream.read(cursor) == ([], cursor) and cursor == store.stream.head()
    store.stream.save_cursor("detection", cursor)
    assert Storage.open(store.engine).stream.cursor("detection") == cursor and store.stream.cursor("other") == 0


def test_latest_is_not_overwritten_by_an_older_backlog(store: Storage) -> None:
    store.writer.ingest(make_batch("n1", "live", [ib_sample(T0, rate=5.0)]), T0, 100)
    store.writer.ingest(make_batch("n1", "spooled", [ib_sample(T0 - 600, rate=1.0)]), T0, 100)
    [(node, latest)] = store.latest.values()
    assert (node, latest.ts, latest.rate) == ("n1", T0, 5.0)


def test_the_newest_point_of_each_series_wins_whatever_the_batches_hold(store: Storage) -> None:
    """A live scrape, a replayed spool of several scrapes and an older scrape alike: of each series
    the newest point is kept in memory and flushed, and of two at one time the later."""
    store.latest.load()

    def latest() -> dict[str, tuple[float, float | None]]:
        return {s.reading.device: (s.ts, s.rate) for _n, s in store.latest.values()}

    store.writer.ingest(make_batch("n1", "a", [ib_sample(T0, rate=1.0), ib_sample(T0, "mlx5_1", rate=1.0)]), T0, 9)
    store.writer.ingest(make_batch("n1", "b", [ib_sample(T0 + 10, rate=2.0), ib_sample(T0 + 10, rate=3.0)]), T0, 9)
    assert latest() == {"mlx5_0": (T0 + 10, 3.0), "mlx5_1": (T0, 1.0)}  # a tie: the later point
    spool = [ib_sample(T0 + 30, rate=4.0), ib_sample(T0 + 20, rate=5.0), ib_sample(T0 + 20, "mlx5_1", rate=6.0)]
    store.writer.ingest(make_batch("n1", "c", spool), T0, 9)
    assert latest() == {"mlx5_0": (T0 + 30, 4.0), "mlx5_1": (T0 + 20, 6.0)}
    store.writer.ingest(
        make_batch("n1", "d", [ib_sample(T0 + 25, rate=7.0), ib_sample(T0 + 25, "mlx5_1", rate=8.0)]), T0, 9
    )
    assert latest() == {"mlx5_0": (T0 + 30, 4.0), "mlx5_1": (T0 + 25, 8.0)}
    assert store.latest.flush() == 2 and table_latest(store) == {"mlx5_0": (T0 + 30, 4.0), "mlx5_1": (T0 + 25, 8.0)}


def table_latest(store: Storage) -> dict[str, tuple[float | None, float | None]]:
    """series device -> (ts, rate) of its latest value as written to the table (``latest_chunks``,
    a packed row per node); (None, None) where none is written."""
    with store.engine.connect() as conn:
        devices = conn.execute(text("SELECT id, device FROM series")).all()
        written = {
            row[0]: (row[1], row[3])
            for _node, count, blob in conn.execute(text("SELECT node, count, points FROM latest_chunks"))
            for row in chunks.rows(bytes(blob), count)
        }
    return {device: written.get(sid, (None, None)) for sid, device in devices}


def latest_cursor(store: Storage) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT position FROM cursors WHERE name = 'latest'")).scalar_one())


def test_latest_values_are_served_from_memory_and_written_by_the_flush(store: Storage) -> None:
    store.latest.load()
    store.writer.ingest(
        make_batch("n1", "a", [ib_sample(T0, rate=5.0), ib_sample(T0, device="mlx5_1", rate=7.0)]), T0, 100
    )
    assert [(n, s.reading.device, s.rate) for n, s in store.latest.values()] == [
        ("n1", "mlx5_0", 5.0),
        ("n1", "mlx5_1", 7.0),
    ]
    assert [s.latest.rate for s in store.inventory.find_series() if s.latest] == [5.0, 7.0]
    assert table_latest(store) == {"mlx5_0": (None, None), "mlx5_1": (None, None)}  # not written yet
    assert store.latest.unflushed() == 2 and latest_cursor(store) == 0
    assert store.latest.flush() == 2
    assert table_latest(store) == {"mlx5_0": (T0, 5.0), "mlx5_1": (T0, 7.0)}
    assert store.latest.unflushed() == 0 and latest_cursor(store) == store.stream.head()
    assert store.latest.flush() == 0  # nothing changed
    # A spooled backlog after a flush leaves the table's newer value alone.
    store.writer.ingest(make_batch("n1", "b", [ib_sample(T0 - 600, rate=1.0)]), T0, 100)
    store.latest.flush()
    assert table_latest(store)["mlx5_0"] == (T0, 5.0)
    assert [s.rate for _, s in store.latest.values(node="n1", source="infiniband", fresh_since=T0)] == [5.0, 7.0]
    assert store.latest.values(node="n2") == [] and store.latest.values(source="pingmesh") == []


def _lldp(ts: float, port: str) -> Sample:
    r = Reading("lldp", "eth0", port, "neighbor", 1.0, "", Kind.GAUGE, (("chassis", f"sw-{port}"),), "neighbor")
    return Sample(ts=ts, reading=r, rate=None, status=Status.OK)


def test_a_sources_latest_values_follow_new_series_and_new_nodes(store: Storage) -> None:
    """``values(source=...)`` keeps each node's picks while its series are the same; a node that
    gains a series, or a new node, is picked again. Every call equals the samples of all series
    filtered by source, for each node, source and freshness."""

    def brute(node: str | None, source: str, fresh: float | None) -> list[tuple[str, Sample]]:
        every = store.latest.values(node=node, fresh_since=fresh)
        return [(n, s) for n, s in every if s.reading.source == source]

    def check() -> None:
        for node in (None, "n1", "n2", "n3"):
            for source in ("lldp", "infiniband", "pingmesh"):
                for fresh in (None, T0 + 5):
                    assert store.latest.values(node=node, source=source, fresh_since=fresh) == brute(
                        node, source, fresh
                    )

    store.latest.load()
    store.writer.ingest(make_batch("n1", "a", [ib_sample(T0), _lldp(T0, "swp1")]), T0, 100)
    store.writer.ingest(make_batch("n2", "b", [ib_sample(T0 + 10), ib_sample(T0 + 10, device="mlx5_1")]), T0, 100)
    check()
    assert [n for n, _ in store.latest.values(source="lldp")] == ["n1"]
    # n1 gains an LLDP neighbour and n3 appears; n2's newer point changes no series
    store.writer.ingest(make_batch("n1", "c", [_lldp(T0 + 10, "swp2"), ib_sample(T0 + 10)]), T0, 100)
    store.writer.ingest(make_batch("n3", "d", [_lldp(T0 + 10, "swp9")]), T0, 100)
    store.writer.ingest(make_batch("n2", "e", [ib_sample(T0 + 20)]), T0, 100)
    check()
    got = [(n, s.reading.port, s.ts) for n, s in store.latest.values(source="lldp", fresh_since=T0 + 5)]
    assert got == [("n1", "swp2", T0 + 10), ("n3", "swp9", T0 + 10)]


def test_a_crash_between_flushes_loses_no_latest_value(store: Storage) -> None:
    """A new process (kill -9 of the old one: no final flush) rebuilds the unflushed latest values
    from the points stored after the ``latest`` cursor."""
    store.writer.ingest(make_batch("n1", "a", [ib_sample(T0, rate=5.0)]), T0, 100)
    store.latest.flush()
    store.writer.ingest(
        make_batch("n1", "b", [ib_sample(T0 + 10, rate=6.0), ib_sample(T0 + 10, device="mlx5_1")]), T0, 100
    )
    store.writer.ingest(make_batch("n2", "c", [ib_sample(T0 + 10, rate=9.0)]), T0, 100)
    store.writer.ingest(make_batch("n1", "d", [ib_sample(T0 - 30, rate=1.0)]), T0, 100)  # older: must not win
    restarted = Storage.open(store.engine)
    got = [(n, s.reading.device, s.ts, s.rate) for n, s in restarted.latest.values()]
    assert got == [("n1", "mlx5_0", T0 + 10, 6.0), ("n1", "mlx5_1", T0 + 10, 1e9), ("n2", "mlx5_0", T0 + 10, 9.0)]
    assert restarted.latest.unflushed() == 3  # replayed values are written by the next flush
    assert restarted.latest.flush() == 3
    again = Storage.open(store.engine)
    assert [(n, s.ts, s.rate) for n, s in again.latest.values()] == [(n, ts, r) for n, _d, ts, r in got]
    assert again.latest.unflushed() == 0


def test_series_a_flush_is_writing_count_as_unflushed_until_written(
    store: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gauge read while a flush writes (seconds on a large fleet) still counts the series
    it took, and one changed again meanwhile once; after the write only that one is left."""
    store.writer.ingest(make_batch("n1", "a", [ib_sample(T0, rate=5.0), ib_sample(T0, device="mlx5_1")]), T0, 100)
    seen: list[int] = []
    real = store.latest._chunk_cursor

    @contextlib.contextmanager
    def observed() -> Iterator[Any]:
        seen.append(store.latest.unflushed())
        store.writer.ingest(make_batch("n1", "b", [ib_sample(T0 + 10, rate=6.0)]), T0 + 10, 100)
        seen.append(store.latest.unflushed())
        with real() as cur:
            yield cur

    monkeypatch.setattr(store.latest, "_chunk_cursor", observed)
    assert store.latest.flush() == 2
    assert seen == [2, 2] and store.latest.unflushed() == 1


def test_a_failed_flush_keeps_the_values_for_the_next_one(store: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    store.writer.ingest(make_batch("n1", "a", [ib_sample(T0, rate=5.0)]), T0, 100)

    good = store.latest.db
    m = good.sql.mark
    gone = f"INSERT INTO latest_chunks_gone (node, count, points) VALUES ({m}, {m}, {m})"
    monkeypatch.setattr(
        store.latest, "db", dataclasses.replace(good, sql=dataclasses.replace(good.sql, write_latest=gone))
    )
    with pytest.raises(Exception, match="latest_chunks_gone"):  # the driver's own error: no such table
        store.latest.flush()
    assert store.latest.unflushed() == 1 and latest_cursor(store) == 0
    monkeypatch.setattr(store.latest, "db", good)
    assert store.latest.flush() == 1 and table_latest(store)["mlx5_0"] == (T0, 5.0)


def incident(key: str, state: IncidentState, ts: float, summary: str = "xmit wait") -> Incident:
    return Incident(
        key=key,
        kind=IncidentKind.CONGESTION,
        severity=Severity.WARNING,
        state=state,
        element="leaf-01",
        summary=summary,
        started_ts=ts,
        updated_ts=ts,
        resolved_ts=ts if state is IncidentState.RESOLVED else None,
        timeline=[(ts, summary)],
    )


def test_incident_upserts_keep_the_ack_and_grow_the_timeline(store: Storage) -> None:
    iid, tr = store.incidents.upsert(incident("k", IncidentState.OPEN, T0))
    assert tr == "opened"
    store.incidents.ack(iid, "alice", T0 + 5, "on it")
    assert store.incidents.upsert(incident("k", IncidentState.OPEN, T0 + 10, "worse")) == (iid, "updated")
    row = store.incidents.get(iid)
    assert (row.state, row.acked_by, row.summary) == ("acked", "alice", "worse")
    assert store.incidents.upsert(incident("k", IncidentState.RESOLVED, T0 + 20))[1] == "resolved"
    assert store.incidents.upsert(incident("k", IncidentState.OPEN, T0 + 30))[1] == "reopened"
    row = store.incidents.get(iid)
    assert row.state == "open" and row.acked_by is None  # a recurrence needs a fresh look
    whats = [e[1] for e in row.timeline]
    assert whats[:3] == ["xmit wait", "opened: xmit wait", "acknowledged: on it"]
    assert "resolved: xmit wait" in whats and "reopened: xmit wait" in whats
    assert [e[0] for e in row.timeline] == sorted(e[0] for e in row.timeline)
    assert len(store.incidents.query()) == 1


def test_unresolved_incidents_come_back_as_the_engine_keeps_them(store: Storage) -> None:
    # What a restarted engine adopts (DetectionLoop): open and acked ones, as open; not the resolved
    # ones; not a kind this version does not know (a newer version wrote it, mid-rollout).
    iid, _ = store.incidents.upsert(incident("congestion:leaf-01", IncidentState.OPEN, T0))
    store.incidents.ack(iid, "alice", T0 + 5)
    store.incidents.upsert(incident("congestion:leaf-02", IncidentState.OPEN, T0))
    store.incidents.upsert(incident("congestion:leaf-02", IncidentState.RESOLVED, T0 + 10))
    newer, _ = store.incidents.upsert(incident("congestion:leaf-03", IncidentState.OPEN, T0))
    with store.engine.begin() as con:
        con.execute(text("UPDATE incidents SET kind = 'microburst' WHERE id = :id"), {"id": newer})
    (adopted,) = store.incidents.unresolved()
    assert (adopted.key, adopted.kind, adopted.state, adopted.element) == (
        "congestion:leaf-01",
        IncidentKind.CONGESTION,
        IncidentState.OPEN,
        "leaf-01",
    )
    assert adopted.timeline == [(T0, "xmit wait"), (T0, "opened: xmit wait"), (T0 + 5, "acknowledged")]


def test_a_narrowed_incident_keeps_its_row_and_its_ack(store: Storage) -> None:
    iid, _ = store.incidents.upsert(incident("congestion:leaf-01", IncidentState.OPEN, T0))
    store.incidents.ack(iid, "alice", T0 + 5, "on it")
    exact = incident("congestion:leaf-01~spine-02", IncidentState.OPEN, T0 + 10, "the uplink")
    exact = dataclasses.replace(exact, element="leaf-01~spine-02", narrowed_from=["congestion:leaf-01"])
    assert store.incidents.upsert(exact) == (iid, "updated")
    (row,) = store.incidents.query()
    assert (row.id, row.key, row.element, row.state, row.acked_by) == (
        iid,
        "congestion:leaf-01~spine-02",
        "leaf-01~spine-02",
        "acked",
        "alice",
    )


def test_narrowing_onto_an_element_with_an_earlier_incident_reopens_that_one(store: Storage) -> None:
    old, _ = store.incidents.upsert(incident("congestion:leaf-01~spine-02", IncidentState.OPEN, T0))
    store.incidents.upsert(incident("congestion:leaf-01~spine-02", IncidentState.RESOLVED, T0 + 10))
    leaf, _ = store.incidents.upsert(incident("congestion:leaf-01", IncidentState.OPEN, T0 + 100))
    exact = incident("congestion:leaf-01~spine-02", IncidentState.OPEN, T0 + 110, "the uplink")
    exact = dataclasses.replace(exact, element="leaf-01~spine-02", narrowed_from=["congestion:leaf-01"])
    assert store.incidents.upsert(exact) == (old, "reopened")
    rows = {r.id: r for r in store.incidents.query()}
    assert (rows[old].state, rows[leaf].state) == ("open", "resolved")
    assert rows[leaf].timeline[-1][1] == "narrowed to leaf-01~spine-02: see congestion:leaf-01~spine-02"


def test_maintenance_downsamples_then_expires(store: Storage) -> None:
    # Two hours of 10 s points; keep 1 h raw, 5 min buckets beyond it, delete past 90 min.
    pts = [ib_sample(T0 + i * 10, value=float(i), rate=float(i % 2)) for i in range(720)]
    store.writer.ingest(make_batch("n1", "a", pts), T0, 100)
    now = T0 + 7200
    report = store.maintenance.run(now, raw_retention=3600, step=300, retention=5400)
    [series] = store.inventory.find_series()
    kept = store.inventory.points(series.id, 0, now + 1)
    raw = [p for p in kept if p.step == 0]
    folded = [p for p in kept if p.step == 300]
    assert all(p.ts >= now - 3600 for p in raw) and len(raw) == 360
    # PostgreSQL drops the half hour past retention as a whole partition, without folding it first.
    partitioned = store.engine.dialect.name == "postgresql"
    assert (report.downsampled_points, report.buckets_written) == ((180, 6) if partitioned else (360, 12))
    assert [p.ts for p in folded] == [T0 + 1800 + 300 * i for i in range(6)]  # the rest expired
    assert all(p.rate == 0.5 for p in folded) and folded[0].value == 209.0  # counter: last value
    # Idempotent: a second run folds nothing new and writes no duplicate buckets.
    again = store.maintenance.run(now, raw_retention=3600, step=300, retention=5400)
    assert (again.downsampled_points, again.deleted_points) == (0, 0)
    # Downsampled points never reach the detectors again.
    samples, _ = flat(store.stream.read(0, limit=100_000))
    assert len(samples) == 360


def test_downsample_uses_the_mean_for_gauges_and_keeps_unknown_rates_unknown() -> None:
    rows = [(0.0, 2.0, None, "first"), (10.0, 4.0, None, "saturated"), (60.0, 1.0, 3.0, "ok")]
    assert downsample(rows, 60, counter=False) == [
        {"ts": 0.0, "value": 3.0, "rate": None, "status": "saturated"},
        {"ts": 60.0, "value": 1.0, "rate": 3.0, "status": "ok"},
    ]


class ThresholdDetector(ImmediateDetector):
    """A minimal real detector: congestion when a port's xmit data rate passes a threshold."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.seen = 0

    def process(self, samples: Sequence[tuple[str, Sample]]) -> list[Incident]:
        self.seen += len(samples)
        out = []
        for node, s in samples:
            if s.rate is not None and s.rate > self.threshold:
                out.append(
                    Incident(
                        key=f"congestion:{node}/{s.reading.device}",
                        kind=IncidentKind.CONGESTION,
                        severity=Severity.CRITICAL,
                        state=IncidentState.OPEN,
                        element=f"{node}/{s.reading.device}",
                        summary="hot port",
                        started_ts=s.ts,
                        updated_ts=s.ts,
                    )
                )
        return out


def test_detection_loop_resumes_from_its_stored_cursor(store: Storage) -> None:
    from prometheus_client import CollectorRegistry

    metrics = ServerMetrics(CollectorRegistry())
    store.writer.ingest(
        make_batch("n1", "a", [ib_sample(T0, rate=10.0), ib_sample(T0, device="mlx5_1", rate=99.0)]), T0, 100
    )
    heard: list[tuple[int, str]] = []
    detector = ThresholdDetector(50.0)
    listeners = [lambda i, tr, _inc: heard.append((i, tr))]
    loop = DetectionLoop(store.stream, store.incidents, detector, metrics, listeners, lambda: T0 + 2)
    assert loop.step() == 2 and loop.step() == 0
    assert [i.element for i in store.incidents.query()] == ["n1/mlx5_1"] and heard[0][1] == "opened"
    assert metrics.detection_lag._value.get() == 2.0
    # A restarted loop starts after what was already processed.
    store.writer.ingest(make_batch("n1", "b", [ib_sample(T0 + 10, rate=1.0)]), T0, 100)
    again = ThresholdDetector(50.0)
    assert DetectionLoop(store.stream, store.incidents, again, metrics).step() == 1 and again.seen == 1
    assert store.stream.cursor("detection") == store.stream.head()


def test_detection_loop_reads_only_the_engines_inputs_yet_hears_every_node(store: Storage) -> None:
    """The loop hands the engine only what it reads (``EngineFeed.inputs``); a node that sent
    nothing of it still counts as heard, so settlement neither waits for it nor leaves it out, and
    the loop counts every point it read (its cursor and "caught up" follow the points)."""
    from prometheus_client import CollectorRegistry

    from fabricd.server.detection import EngineFeed

    vl15 = {"counter": "vl15_dropped", "name": "vl15_dropped", "unit": "packets"}  # no detector reads it
    for k in range(4):
        ts = T0 + 10.0 * k
        store.writer.ingest(make_batch("n1", f"a{k}", [ib_sample(ts), ib_sample(ts, **vl15)]), T0, 100)
        store.writer.ingest(make_batch("n2", f"b{k}", [ib_sample(ts, **vl15)]), T0, 100)
    feed = EngineFeed(DetectionEngine())
    loop = DetectionLoop(store.stream, store.incidents, feed, ServerMetrics(CollectorRegistry()), clock=lambda: T0 + 31)
    assert loop.step() == 12 and loop.step() == 0  # every point counted, the skipped ones too
    state = feed.settlement()
    assert state.nodes == 2 and state.left_out == () and (state.settled_ts or 0) >= T0 + 30.0
    assert store.stream.cursor("detection") == store.stream.head()  # all of it evaluated


def test_tokens_are_stored_hashed_and_revocable(store: Storage) -> None:
    _tid, token = store.tokens.create("agent", T0, node="n1")
    with store.engine.connect() as conn:
        stored = [r[0] for r in conn.execute(text("SELECT digest FROM tokens"))]
    assert token not in stored and len(stored[0]) == 64
    assert store.tokens.find(token) is not None and store.tokens.find(token + "x") is None
    store.tokens.revoke(token, T0)
    assert store.tokens.find(token) is None
    assert store.tokens.all()[0].revoked_ts == T0
    with pytest.raises(ValueError, match="role"):
        store.tokens.create("root", T0)


def test_the_stream_tail_reads_exactly_what_the_database_holds(store: Storage) -> None:
    """A stream that follows the writer answers from memory; every read must equal the database's
    answer (a stream that does not follow) for the same cursor and limit: the same deliveries in the
    same order, the same next cursor. A reader that keeps up opens no database connection."""
    store.writer.ingest(make_batch("n0", "before", [ib_sample(T0 - 10), ib_sample(T0 - 4000, device="old")]), T0, 100)
    # Follows from its first commit on; on PostgreSQL the old point's half hour is a partition of its own.
    live = Storage.open(store.engine, stream_tail_points=12, partition_seconds=1800.0)
    batches = [
        make_batch("n1", "a", [ib_sample(T0 + 1), ib_sample(T0 + 1, device="mlx5_1", rate=3.5)]),
        make_batch("n2", "b", [ib_sample(T0 - 300, rate=None, value=7.0)]),  # a spooled backlog
        make_batch("n1", "a", [ib_sample(T0 + 1)]),  # a retry: nothing stored
        make_batch("n3", "c", [ib_sample(T0 + 2, device=f"mlx5_{i}") for i in range(5)]),
    ]
    for b in batches:
        live.writer.ingest(b, T0, 100)
    # Folds n0's old point into a bucket: a non-raw point (on SQLite with an id between two batches' ids).
    assert live.maintenance.run(T0, raw_retention=600, step=60, retention=1e9).buckets_written == 1
    live.writer.ingest(make_batch("n1", "d", [ib_sample(T0 + 11), ib_sample(T0 + 11, device="mlx5_1")]), T0, 100)

    def key(got: tuple[list[Delivery], int]) -> tuple[list[tuple[object, ...]], int]:
        deliveries, cursor = got
        return [(d.node, [(s.ts, s.reading, s.rate, s.status, s.since) for s in d.samples]) for d in deliveries], cursor

    last = store.stream.head()
    for cursor in range(0, last + 1):
        for limit in (1, 2, 3, 100):
            assert key(live.stream.read(cursor, limit)) == key(store.stream.read(cursor, limit)), (cursor, limit)
    assert [d.node for d in live.stream.read(0)[0]] == ["n0", "n1", "n2", "n3", "n1"]
    # Past max_points the oldest batches leave the tail; a reader that far behind reads the database.
    for i in range(4):
        batch = make_batch("n4", f"e{i}", [ib_sample(T0 + 20 + i, device=f"mlx5_{j}") for j in range(4)])
        live.writer.ingest(batch, T0, 100)
    newest = store.stream.head()
    live.stream.read(newest - 12, 100)  # n4's series are new: their identities are read once
    checkouts: list[object] = []
    event.listen(store.engine, "checkout", lambda *_args: checkouts.append(1))
    recent, upto = live.stream.read(newest - 12, 100)  # the last three batches: still in memory
    assert [(d.node, len(d.samples)) for d in recent] == [("n4", 12)] and upto == newest and checkouts == []
    assert key(live.stream.read(newest - 13, 100)) == key(store.stream.read(newest - 13, 100)) and checkouts
    assert key(live.stream.read(0, 1000)) == key(store.stream.read(0, 1000))


def test_a_reader_that_names_its_inputs_gets_only_those_from_memory_and_database_alike(store: Storage) -> None:
    """The detection loop reads only the detectors' inputs (``records.Keep``): the samples of other
    series are never built, yet each delivery still counts every point it covers and the event
    times of its scrapes (settlement needs them: tests/test_settle.py), and the tail answers as
    the database does."""
    live = Storage.open(store.engine, stream_tail_points=100, partition_seconds=1800.0)
    vl15 = {"counter": "vl15_dropped", "name": "vl15_dropped", "unit": "packets"}  # no detector reads it
    for b in [
        make_batch("n1", "a", [ib_sample(T0 + 1), ib_sample(T0 + 1, **vl15), ib_sample(T0 + 1, device="mlx5_1")]),
        make_batch("n2", "b", [ib_sample(T0 + 1, **vl15), ib_sample(T0 + 2, device="mlx5_1", **vl15)]),
        make_batch("n1", "c", [ib_sample(T0 + 11, **vl15), ib_sample(T0 + 11)]),
    ]:
        live.writer.ingest(b, T0, 100)
    keep = Keep(DetectionEngine().inputs())

    def key(got: tuple[list[Delivery], int]) -> tuple[list[tuple[object, ...]], int]:
        deliveries, cursor = got
        return [
            (d.node, [(s.ts, s.reading.device, s.reading.counter) for s in d.samples], d.read, list(d.stamps or ()))
            for d in deliveries
        ], cursor

    head = store.stream.head()
    assert key(live.stream.read(0, 100, keep=keep)) == (
        [
            ("n1", [(T0 + 1, "mlx5_0", "port_xmit_data"), (T0 + 1, "mlx5_1", "port_xmit_data")], 3, [T0 + 1]),
            ("n2", [], 2, [T0 + 1, T0 + 2]),
            ("n1", [(T0 + 11, "mlx5_0", "port_xmit_data")], 2, [T0 + 11]),
        ],
        head,
    )
    for cursor in range(0, head + 1):
        for limit in (1, 2, 3, 100):
            got = live.stream.read(cursor, limit, keep=keep)
            assert key(got) == key(store.stream.read(cursor, limit, keep=keep)), (cursor, limit)
            assert sum(d.read for d in got[0]) == got[1] - cursor  # every point read is counted
    # Without a keep (or keeping everything) every sample is built, as before.
    whole = [(d.node, len(d.samples), d.read) for d in live.stream.read(0, 100)[0]]
    assert whole == [("n1", 3, 3), ("n2", 2, 2), ("n1", 2, 2)]
    assert key(live.stream.read(0, 100, keep=Keep(None))) == key(live.stream.read(0, 100))


def test_a_reader_of_rates_only_gets_each_counter_with_its_series_identity(store: Storage) -> None:
    """``Keep(rates_only=True)`` (the detection loop's, for the engine reads a counter's rate only)
    builds no ``Reading`` per counter point: the samples carry the series' identity (value 0.0, one
    object for every point of the series) with their own time, rate and status; a gauge still
    carries its value; a reader without it gets every reading whole, from memory and database alike."""
    live = Storage.open(store.engine, stream_tail_points=100, partition_seconds=1800.0)
    state = {"counter": "state", "name": "port_state", "unit": "", "kind": Kind.GAUGE, "rate": None}
    for k, ts in enumerate((T0 + 1, T0 + 11)):
        batch = make_batch(
            "n1", f"r{k}", [ib_sample(ts, value=4096.0 * (k + 1), rate=1e9 + k), ib_sample(ts, value=4.0, **state)]
        )
        live.writer.ingest(batch, T0, 100)
    inputs = DetectionEngine().inputs()
    assert keep_for(EngineFeed(DetectionEngine())).rates_only  # what the loop reads for the engine
    assert keep_for(ImmediateDetector()) is None  # a detector that names no inputs: everything, whole

    def points(got: tuple[list[Delivery], int]) -> list[tuple[object, ...]]:
        return [(s.ts, s.reading.name, s.reading.value, s.rate, s.status) for d in got[0] for s in d.samples]

    expect_rates = [
        (T0 + 1, "port_transmit_data", 0.0, 1e9, Status.OK),
        (T0 + 1, "port_state", 4.0, None, Status.FIRST),
        (T0 + 11, "port_transmit_data", 0.0, 1e9 + 1, Status.OK),
        (T0 + 11, "port_state", 4.0, None, Status.FIRST),
    ]
    expect_whole = [
        (T0 + 1, "port_transmit_data", 4096.0, 1e9, Status.OK),
        (T0 + 1, "port_state", 4.0, None, Status.FIRST),
        (T0 + 11, "port_transmit_data", 8192.0, 1e9 + 1, Status.OK),
        (T0 + 11, "port_state", 4.0, None, Status.FIRST),
    ]
    for stream in (live.stream, store.stream):  # memory, database
        rates = stream.read(0, 100, keep=Keep(inputs, rates_only=True))
        assert points(rates) == expect_rates
        counters = [s.reading for d in rates[0] for s in d.samples if s.reading.kind is Kind.COUNTER]
        assert counters[0] is counters[1]  # the identity, shared: nothing built per point
        assert points(stream.read(0, 100, keep=Keep(inputs))) == expect_whole
        assert points(stream.read(0, 100)) == expect_whole


def test_the_writer_hands_each_commit_to_its_listeners_in_commit_order(
    store: Storage, caplog: pytest.LogCaptureFixture
) -> None:
    """Batches written by eight threads at once, in group commits: every stored batch reaches a
    listener once, after its commit, in ``points.id`` order, with the ids its points got. Retries
    and refused batches reach no listener; a listener that fails does not fail a stored batch."""

    class Recorder:
        def __init__(self) -> None:
            self.seen: list[Committed] = []

        def committed(self, batches: Sequence[Committed]) -> None:
            self.seen.extend(batches)

    class Broken:
        def committed(self, batches: Sequence[Committed]) -> None:
            raise RuntimeError("listener bug")

    heard = Recorder()
    store.writer.subscribe(Broken())
    store.writer.subscribe(heard)

    def agent(node: str) -> None:
        for k in range(10):
            store.writer.ingest(make_batch(node, f"b{k}", [ib_sample(T0 + k, device=f"d{j}") for j in range(3)]), T0, 3)
        store.writer.ingest(make_batch(node, "b0", [ib_sample(T0)]), T0, 3)  # a retry
        with pytest.raises(SeriesLimitExceeded):
            store.writer.ingest(make_batch(node, "over", [ib_sample(T0, device="d9")]), T0, 3)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(agent, [f"n{i}" for i in range(8)]))
    stored = raw_points(store.engine)
    announced = [(c.last_point_id - len(c.rows) + 1 + i, *row) for c in heard.seen for i, row in enumerate(c.rows)]
    assert announced == [tuple(r) for r in stored] and len(heard.seen) == 80
    every_batch_once = sorted((f"n{i}", T0 + k) for i in range(8) for k in range(10))
    assert sorted((c.node, c.rows[0][1]) for c in heard.seen) == every_batch_once
    assert "a listener of committed batches failed" in caplog.text
    assert len(store.latest.values()) == 24  # the latest values heard every batch despite the broken listener


def test_the_detector_follows_the_stored_topology_and_its_routes(store: Storage, tmp_path: Path) -> None:
    """Probe routes uploaded with the topology (ibtracert, traceroute) reach the localizer: a routed
    pair has the one path it takes, an unrouted pair every ECMP alternative."""
    from fabricd.server.detection import EngineDetector
    from fabricd.settings import ServerSettings
    from fabricd.topology import fat_tree, to_doc

    route = [
        "node-001",
        "node-003",
        "node-001/mlx5_0",
        "node-003/mlx5_0",
        "node-001/mlx5_0~leaf-01",
        "leaf-01~spine-02",
        "leaf-02~spine-02",
        "node-003/mlx5_0~leaf-02",
    ]
    store.topology.put(to_doc(fat_tree(4, 1, 2, 2, "roce"), {("node-001", "node-003"): route}), T0)
    detector = EngineDetector(ServerSettings(data_dir=tmp_path), store.topology)
    assert detector.deliver([], T0, frozenset()) == []  # reads the stored topology
    localizer = detector.engine.localizer
    assert localizer is not None
    (path,) = localizer.pair_paths("node-001", "node-003")
    assert set(route) <= path and "spine-02" in path and "leaf-01~spine-01" not in path
    assert len(localizer.pair_paths("node-003", "node-001")) == 2  # no route uploaded: both spines


def test_touch_moves_only_updated_and_never_reopens(store: Storage) -> None:
    iid, _ = store.incidents.upsert(incident("t", IncidentState.OPEN, T0))
    store.incidents.ack(iid, "alice", T0 + 5)
    before = store.incidents.get(iid)
    assert store.incidents.touch("t", T0 + 40) is True
    after = store.incidents.get(iid)
    assert after.updated_ts == T0 + 40
    assert (after.state, after.acked_by, after.timeline, after.summary) == (
        before.state,
        before.acked_by,
        before.timeline,
        before.summary,
    )
    assert store.incidents.touch("t", T0 + 30) is False  # never backwards
    store.incidents.resolve(iid, "bob", T0 + 50)
    assert store.incidents.touch("t", T0 + 60) is False  # an engineer's resolve stands
    assert store.incidents.get(iid).state == "resolved"
    assert store.incidents.touch("no-such-key", T0) is False


def _as_one_group(store: Storage, *batches: Batch) -> list[object]:
    """Ingest the batches as one group: queued while the test holds the write lock; each
    outcome is its result or the error that refused it.

    These are the group's own semantics, for batches whose series the writer resolves under its
    lock: on PostgreSQL a new node's first batch stores its series before it queues, in a
    transaction of its own (tests/test_store_series_ahead.py), so that step is off here."""
    store.writer.ahead = None
    outcomes: list[object] = [None] * len(batches)

    def one(i: int) -> None:
        try:
            outcomes[i] = store.writer.ingest(batches[i], T0, 3)
        except Exception as exc:
            outcomes[i] = exc

    with ThreadPoolExecutor(len(batches)) as pool:
        with store.writer.db.write_lock:
            futures = [pool.submit(one, i) for i in range(len(batches))]
            while len(store.writer._queue) < len(batches):  # every batch waits for the lock
                time.sleep(0.001)
        for f in futures:
            f.result()
    return outcomes


def test_a_group_commit_is_one_transaction_and_a_refused_batch_takes_no_other_with_it(store: Storage) -> None:
    """Batches queued while another thread writes go in one transaction; when one of them is
    refused, that transaction is rolled back and each batch is written alone: the others are
    stored, the refused one leaves nothing (no batch id, no series, no point), a retry is a
    duplicate."""
    commits: list[int] = []
    event.listen(store.engine, "commit", lambda _conn: commits.append(1))
    store.writer.ingest(make_batch("n3", "stored", [ib_sample(T0)]), T0, 3)

    commits.clear()
    good = _as_one_group(
        store, *(make_batch(f"g{i}", "b", [ib_sample(T0, device=f"d{j}") for j in range(3)]) for i in range(3))
    )
    assert good == [IngestResult("b", 3, False, 3)] * 3 and len(commits) == 1
    commits.clear()
    over = [ib_sample(T0 + 1, device=f"d{j}") for j in range(4)]  # a fourth series: over the limit of 3
    n1, n2, retry, n4 = _as_one_group(
        store,
        make_batch("n1", "a", [ib_sample(T0 + 1)]),
        make_batch("n2", "over", over),
        make_batch("n3", "stored", [ib_sample(T0)]),
        make_batch("n4", "a", [ib_sample(T0 + 1)]),
    )
    assert isinstance(n2, SeriesLimitExceeded) and n2.node == "n2"
    assert (n1, retry, n4) == (
        IngestResult("a", 1, False, 1),
        IngestResult("stored", 0, True),
        IngestResult("a", 1, False, 1),
    )
    assert len(commits) == 3  # the group rolled back; then n1, the retry (nothing to write), n4 alone
    with store.engine.connect() as conn:
        batches = conn.execute(text("SELECT node, batch_id FROM ingested_batches ORDER BY node")).all()
        series = conn.execute(text("SELECT DISTINCT node FROM series ORDER BY node")).scalars().all()
        counted = conn.execute(text("SELECT batches FROM nodes WHERE name = 'n3'")).scalar()
    assert counted == 1  # the retry claimed nothing and counted nothing
    assert [tuple(b) for b in batches] == [
        ("g0", "b"),
        ("g1", "b"),
        ("g2", "b"),
        ("n1", "a"),
        ("n3", "stored"),
        ("n4", "a"),
    ]
    assert series == ["g0", "g1", "g2", "n1", "n3", "n4"] and len(raw_points(store.engine)) == 9 + 1 + 1 + 1


def test_the_series_a_batch_creates_reach_the_readers_as_the_table_has_them(store: Storage) -> None:
    """The writer hands each committed batch's new series to its listeners (``Committed.series``);
    the identities learn them from there: a reader finds them without a query, equal to what the
    table holds. A group rolled back and written again batch by batch announces only the series that
    were kept (PostgreSQL's ids of the rolled-back attempt are never reused)."""
    announced: list[Committed] = []

    class Listener:
        def committed(self, batches: Sequence[Committed]) -> None:
            announced.extend(batches)

    store.writer.subscribe(Listener())
    gauge = {"counter": "state", "name": "port_state", "unit": "", "kind": Kind.GAUGE, "rate": None}
    outcomes = _as_one_group(
        store,
        make_batch("new1", "a", [ib_sample(T0, labels=[("prio", "3"), ("dir", "rx")]), ib_sample(T0, **gauge)]),
        make_batch("new2", "over", [ib_sample(T0, device=f"d{j}") for j in range(4)]),  # over the limit: refused
        make_batch("new4", "a", [ib_sample(T0, device="mlx5_1")]),
    )
    # new1's labels come unsorted (an in-process caller; the wire sorts them): stored all the same
    assert (outcomes[0], outcomes[2]) == (IngestResult("a", 2, False, 2), IngestResult("a", 1, False, 1))
    assert isinstance(outcomes[1], SeriesLimitExceeded)
    with store.engine.connect() as conn:
        ids = set(conn.execute(text("SELECT id FROM series WHERE node LIKE 'new%'")).scalars())
    assert {row[0] for b in announced for row in b.series} == ids and len(ids) == 3
    checkouts: list[object] = []

    def count(*_args: object) -> None:
        checkouts.append(1)

    event.listen(store.engine, "checkout", count)
    known = store.stream.identities.of(ids)
    assert checkouts == []  # learned from the writer
    from_table = Identities(store.stream.db).of(ids)
    assert checkouts and {sid: known[sid] for sid in ids} == {sid: from_table[sid] for sid in ids}
    event.remove(store.engine, "checkout", count)


def test_nodes_with_the_same_series_share_one_identity_reading_and_the_readings_are_bounded(
    store: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The identity cache keeps one ``Reading`` per distinct series of the fleet, whatever its node
    (a fleet's nodes repeat the same few hundred): learned from the writer or read from the table,
    equal series of two nodes are the same object, and the shared readings stay bounded."""
    from fabricd.server.store import identities

    for node in ("r1", "r2"):
        store.writer.ingest(make_batch(node, "a", [ib_sample(T0), ib_sample(T0, device="mlx5_1")]), T0, 10)
    with store.engine.connect() as conn:
        ids = dict(conn.execute(text("SELECT node || '/' || device, id FROM series WHERE node LIKE 'r_'")).all())
    for cache in (store.stream.identities, Identities(store.stream.db)):  # from the writer; from the table
        got = cache.of(set(ids.values()))
        assert got[ids["r1/mlx5_0"]][1] is got[ids["r2/mlx5_0"]][1]
        assert got[ids["r1/mlx5_0"]][0] == "r1" and got[ids["r2/mlx5_0"]][0] == "r2"
        assert got[ids["r1/mlx5_0"]][1] is not got[ids["r1/mlx5_1"]][1]
        assert got[ids["r1/mlx5_1"]][1].device == "mlx5_1" and got[ids["r1/mlx5_1"]][1].value == 0.0
    monkeypatch.setattr(identities, "READING_CACHE_MAX", 2)
    readings = identities.Readings()
    columns = [
        ("infiniband", f"mlx5_{k}", "1", "port_xmit_data", "port_transmit_data", "bytes", "counter", "{}")
        for k in range(3)
    ]
    several = identities.Readings()  # a batch's at once: found, made, and one twice
    cached = several.of(columns[0])
    got = several.many([columns[1], columns[0], columns[1]])
    assert got[1] is cached and got[0] is got[2] is several.of(columns[1]) and got[0].device == "mlx5_1"
    first = readings.of(columns[0])
    assert readings.of(columns[0]) is first
    readings.of(columns[1])
    readings.of(columns[2])  # a third: the cache starts again
    assert len(readings._by_columns) == 1 and readings.of(columns[0]) is not first and readings.of(columns[0]) == first


def test_the_stream_head_follows_the_writer_without_asking_the_database(
    store: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The detection loop asks for the head every step (its backlog gauge): with the tail following
    the writer it is the newest committed point, the table's ``max(id)`` without the query."""
    live = Storage.open(store.engine, stream_tail_points=1_000)
    assert live.stream.head() == 0  # nothing stored yet: the table says so
    for k in range(3):
        live.writer.ingest(make_batch("n1", f"b{k}", [ib_sample(T0 + k, device=f"d{j}") for j in range(4)]), T0, 8)
    newest = live.writer.db.max_point_id()

    def no_query(_db: object) -> int:
        raise AssertionError("max(id) queried")

    monkeypatch.setattr(type(live.writer.db), "max_point_id", no_query)
    assert live.stream.head() == newest and newest > 0


def test_the_detection_loop_saves_its_cursor_at_most_once_a_second(store: Storage) -> None:
    """Every stored batch wakes the loop; the cursor is written when it moved and a second has
    passed on the loop's clock since the last write (the first at once), not every step."""
    from prometheus_client import CollectorRegistry

    from fabricd.server import detection

    now = [T0 + 100.0]
    saves: list[int] = []
    stream = store.stream
    original = stream.save_cursor

    def save(name: str, position: int) -> None:
        saves.append(position)
        original(name, position)

    stream.save_cursor = save  # type: ignore[method-assign]
    metrics = ServerMetrics(CollectorRegistry())
    loop = DetectionLoop(stream, store.incidents, ThresholdDetector(1e12), metrics, clock=lambda: now[0])
    heads = []
    for k in range(4):  # four batches within half a second
        store.writer.ingest(make_batch("n1", f"b{k}", [ib_sample(T0 + k)]), T0, 8)
        heads.append(store.stream.head())
        loop.step()
        now[0] += 0.1
    assert saves == [heads[0]]  # the first at once, then nothing for a second
    now[0] += detection.CURSOR_SAVE_SECONDS
    assert loop.step() == 0 and saves == [heads[0], heads[3]]
    now[0] += detection.CURSOR_SAVE_SECONDS
    assert loop.step() == 0 and len(saves) == 2  # not moved: not written again
    assert stream.cursor("detection") == heads[3]


def test_a_group_the_database_fails_is_refused_whole_and_not_written_again(store: Storage) -> None:
    """When the database fails the transaction (the commit: a full disk, a lost connection) and no
    batch did, every batch of the group gets that error at once: nothing kept, no batch written
    again alone, and the agents retry later."""
    begins: list[int] = []
    event.listen(store.engine, "begin", lambda _conn: begins.append(1))

    def broken(_conn: object) -> None:
        raise OSError("No space left on device")

    event.listen(store.engine, "commit", broken)
    outcomes = _as_one_group(store, *(make_batch(f"n{i}", "a", [ib_sample(T0)]) for i in range(3)))
    assert [str(o) for o in outcomes] == ["No space left on device"] * 3 and len(begins) == 1
    event.remove(store.engine, "commit", broken)
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ingested_batches")).scalar() == 0
    assert store.writer.ingest(make_batch("n0", "a", [ib_sample(T0)]), T0, 3) == IngestResult("a", 1, False, 1)


def test_new_series_take_their_returned_ids_and_one_another_writer_created_is_read_back(store: Storage) -> None:
    """A node's new series get the ids their ``INSERT .. RETURNING`` gave, with no read of the node's
    series after it; a series another writer (a replica) created after this one cached the node's is
    not returned (``ON CONFLICT DO NOTHING``), so the node's series are read back, and the batch's
    points land on that series, not on a second one. Labels in any order name one series."""
    other = Storage.open(store.engine)  # the other replica: its own writer and cache
    labeled = ib_sample(T0 + 10, device="mlx5_3", labels=(("z", "1"), ("a", "2")))
    assert store.writer.ingest(make_batch("n0", "a", [ib_sample(T0)]), T0, 10) == IngestResult("a", 1, False, 1)
    assert other.writer.ingest(make_batch("n0", "b", [ib_sample(T0, device="mlx5_1")]), T0, 10).new_series == 1
    both = [ib_sample(T0 + 10), ib_sample(T0 + 10, device="mlx5_1"), ib_sample(T0 + 10, device="mlx5_2"), labeled]
    assert store.writer.ingest(make_batch("n0", "c", both), T0 + 10, 10) == IngestResult("c", 4, False, 2)
    again = [ib_sample(T0 + 20, device="mlx5_2"), ib_sample(T0 + 20, device="mlx5_3", labels=(("a", "2"), ("z", "1")))]
    assert store.writer.ingest(make_batch("n0", "d", again), T0 + 20, 10) == IngestResult("d", 2, False, 0)
    with store.engine.connect() as conn:
        ids = dict(conn.execute(text("SELECT device, id FROM series WHERE node = 'n0'")).all())
    assert sorted(ids) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    stored = sorted((sid, ts) for _, sid, ts, *_ in raw_points(store.engine))
    want = [(ids["mlx5_0"], T0), (ids["mlx5_1"], T0), (ids["mlx5_0"], T0 + 10), (ids["mlx5_1"], T0 + 10)]
    want += [(ids["mlx5_2"], T0 + 10), (ids["mlx5_3"], T0 + 10), (ids["mlx5_2"], T0 + 20), (ids["mlx5_3"], T0 + 20)]
    assert stored == sorted(want)


def test_a_batch_the_database_refuses_by_a_constraint_is_an_error_not_a_duplicate(store: Storage) -> None:
    """Every conflict the writer expects (a retried batch id, a series another replica created) is
    an ``ON CONFLICT`` no-op; any other constraint violation refusing a batch (here a constraint the
    test adds on huge values) is an error the agent hears, so it keeps the batch and retries: taken
    for "stored by another process", the batch would be acknowledged and lost. The group's other
    batches are stored, and once the database accepts it the same batch id is stored whole."""
    postgres = store.engine.dialect.name == "postgresql"
    add = (
        # A batch's points are one chunk (fabricd/server/store/chunks.py): the huge batch is the
        # one with two points.
        "ALTER TABLE point_chunks ADD CONSTRAINT points_not_huge CHECK (count < 2)"
        if postgres
        else "CREATE TRIGGER points_not_huge BEFORE INSERT ON point_chunks WHEN NEW.count >= 2 "
        "BEGIN SELECT RAISE(ABORT, 'chunk too large'); END"
    )
    with store.engine.begin() as conn:
        conn.execute(text(add))
    huge = make_batch("n1", "a", [ib_sample(T0), ib_sample(T0, device="mlx5_1", value=1e301)])
    fine = make_batch("n2", "a", [ib_sample(T0)])
    refused, stored = _as_one_group(store, huge, fine)
    assert isinstance(refused, store.engine.dialect.loaded_dbapi.IntegrityError) and (
        "points_not_huge" if postgres else "too large"
    ) in str(refused)
    assert stored == IngestResult("a", 1, False, 1)
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT node FROM ingested_batches")).scalars().all() == ["n2"]
    drop = "ALTER TABLE point_chunks DROP CONSTRAINT points_not_huge" if postgres else "DROP TRIGGER points_not_huge"
    with store.engine.begin() as conn:
        conn.execute(text(drop))
    assert store.writer.ingest(huge, T0, 3) == IngestResult("a", 2, False, 2)


def test_the_writer_keeps_its_connection_between_batches_and_lets_a_dead_one_go(store: Storage) -> None:
    """One pool checkout for many batches (no pre-ping round trip per batch); a connection the
    database dropped fails the batch in flight, an error its agent retries, and the next batch
    takes a fresh connection from the pool."""
    postgres = store.engine.dialect.name == "postgresql"
    store.writer.ahead = None  # its kept connections are the same HeldConnection's: the writer's alone here
    checkouts: list[object] = []
    event.listen(store.engine, "checkout", lambda dbapi, *_a: checkouts.append(dbapi))
    for i in range(3):
        assert store.writer.ingest(make_batch("n1", f"b{i}", [ib_sample(T0 + i)]), T0, 3).accepted == 1
    assert len(checkouts) == 1
    if postgres:  # as a database restart or an idle timeout would
        with store.engine.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": checkouts[0].info.backend_pid})
        with pytest.raises((store.engine.dialect.loaded_dbapi.OperationalError, OperationalError)):
            store.writer.ingest(make_batch("n1", "lost", [ib_sample(T0 + 5)]), T0, 3)
        assert store.writer.ingest(make_batch("n1", "lost", [ib_sample(T0 + 5)]), T0, 3).accepted == 1
    store.writer.close()
    assert store.writer.ingest(make_batch("n1", "after", [ib_sample(T0 + 6)]), T0, 3).accepted == 1
    assert len(raw_points(store.engine)) == (5 if postgres else 4)


def test_the_tail_reads_a_nodes_batches_of_the_same_series_through_one_plan(
    store: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's agent sends the same series in the same order every scrape: the detection loop's
    read makes one ``Plan`` of which rows it keeps and reuses it, looking at no left-out row again;
    a batch of other series makes a new one. What it reads is what the database path reads."""
    from fabricd.server.store import plans as plans_module

    live = Storage.open(store.engine, stream_tail_points=1000, partition_seconds=1800.0)
    vl15 = {"counter": "vl15_dropped", "name": "vl15_dropped", "unit": "packets"}  # left out
    for k in range(3):
        ts = T0 + 10 * k
        live.writer.ingest(make_batch("n1", f"s{k}", [ib_sample(ts, **vl15), ib_sample(ts, rate=1.0 + k)]), T0, 100)
    plans: list[object] = []
    made = plans_module._plan
    monkeypatch.setattr(plans_module, "_plan", lambda *a: plans.append(1) or made(*a))
    keep = keep_for(EngineFeed(DetectionEngine()))
    assert keep is not None
    got, upto = live.stream.read(0, 100, keep=keep)
    assert [(d.node, [(s.ts, s.rate) for s in d.samples], d.read, list(d.stamps or ())) for d in got] == [
        ("n1", [(T0, 1.0), (T0 + 10, 2.0), (T0 + 20, 3.0)], 6, [T0, T0 + 10, T0 + 20])
    ]
    assert len(plans) == 1
    live.writer.ingest(make_batch("n1", "other", [ib_sample(T0 + 30, device="mlx5_1", rate=9.0)]), T0, 100)
    live.stream.read(upto, 100, keep=keep)
    assert len(plans) == 2
    for cursor in range(store.stream.head() + 1):
        mine, theirs = live.stream.read(cursor, 100, keep=keep), store.stream.read(cursor, 100, keep=keep)
        assert [(d.node, [(s.ts, s.rate) for s in d.samples], d.read) for d in mine[0]] == [
            (d.node, [(s.ts, s.rate) for s in d.samples], d.read) for d in theirs[0]
        ]


def test_a_read_that_cuts_a_batch_keeps_the_nodes_whole_plan_and_hands_scrapes_as_rows(
    store: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read takes at most ``limit`` points, so its first and last batches may be cut: their plan
    is made for the part read and must not replace the node's plan of its whole batches (two cut
    batches a read made every later scrape of their nodes plan again). A batch that says it is
    one scrape (``first_ts == last_ts``, as agents send and ``wire.decode`` checks) is handed on as
    its rows; one of several scrapes as the samples of each."""
    from fabricd.scrape_rows import ScrapeRows
    from fabricd.server.store import plans as plans_module

    live = Storage.open(store.engine, stream_tail_points=1000, partition_seconds=1800.0)
    vl15 = {"counter": "vl15_dropped", "name": "vl15_dropped", "unit": "packets"}  # left out
    for k in range(3):
        ts = T0 + 10 * k
        batch = make_batch("n1", f"s{k}", [ib_sample(ts, **vl15), ib_sample(ts, rate=1.0 + k), ib_sample(ts, **vl15)])
        batch.first_ts = batch.last_ts = ts
        live.writer.ingest(batch, T0, 100)
    two = make_batch("n1", "two", [ib_sample(T0 + 30, rate=4.0), ib_sample(T0 + 40, rate=5.0)])
    two.first_ts, two.last_ts = T0 + 30, T0 + 40
    live.writer.ingest(two, T0, 100)
    plans: list[object] = []
    made = plans_module._plan
    monkeypatch.setattr(plans_module, "_plan", lambda *a: plans.append(1) or made(*a))
    keep = keep_for(EngineFeed(DetectionEngine()))
    assert keep is not None
    first, upto = live.stream.read(0, 4, keep=keep)  # s0 whole, s1's first point
    rest, _ = live.stream.read(upto, 100, keep=keep)  # s1's last two points, s2 whole, then "two"
    assert len(plans) == 4  # s0; s1's head; s1's tail; "two" (s2 took s0's plan)
    assert len(keep.plans["n1"].sids) == 2  # the node's last whole batch: "two"
    got = [(type(d.samples).__name__, [(s.ts, s.rate) for s in d.samples], d.read, d.stamps) for d in first + rest]
    assert got == [
        ("list", [(T0, 1.0)], 4, [T0, T0 + 10]),  # s1's first point is left out: its scrape still counts
        (
            "list",
            [(T0 + 10, 2.0), (T0 + 20, 3.0), (T0 + 30, 4.0), (T0 + 40, 5.0)],
            7,
            [T0 + 10, T0 + 20, T0 + 30, T0 + 40],
        ),
    ]
    # each delivery joins a node's consecutive batches: read one batch at a time, they stay rows
    one, _ = live.stream.read(upto + 2, 3, keep=keep)
    assert [(type(d.samples), d.read) for d in one] == [(ScrapeRows, 3)] and one[0].samples.ts == T0 + 20
    for cursor in range(store.stream.head() + 1):
        for limit in (1, 2, 4, 100):
            mine, theirs = live.stream.read(cursor, limit, keep=keep), store.stream.read(cursor, limit, keep=keep)
            assert [(d.node, [(s.ts, s.rate) for s in d.samples], d.read, d.stamps) for d in mine[0]] == [
                (d.node, [(s.ts, s.rate) for s in d.samples], d.read, d.stamps) for d in theirs[0]
            ], (cursor, limit)


def test_the_stream_reads_points_back_from_their_chunks_with_the_same_values(store: Storage) -> None:
    """The database path of the stream (a loop behind the tail, the correlator's partitions) reads
    a batch's chunk (``chunk_reads.ChunkSQL``): on PostgreSQL its blob comes in the binary
    protocol, not as hex text twice its size. The values are the ones stored: floats to the last
    bit, NULLs, the status."""
    samples = [
        ib_sample(T0 + 0.1, rate=1 / 3, value=2.0**53 + 1),
        ib_sample(T0 + 0.1, device="mlx5_1", rate=None, value=-0.0),
        ib_sample(T0 + 0.1, device="mlx5_2", rate=5e-324, value=1e308),
    ]
    store.writer.ingest(make_batch("n1", "b", samples), T0, 100)
    database = store.stream.db
    binary = None
    with database.cursor() as cur:
        fetched = database.sql.chunks.after(cur, 0, 100)
        if store.engine.dialect.name == "postgresql":
            binary = cur.pgresult.fformat(2)
    assert [(r[0], r[3], r[4], r[5]) for r in fetched] == [
        (1, 2.0**53, 1 / 3, "ok"),
        (2, 0.0, None, "first"),
        (3, 1e308, 5e-324, "ok"),
    ]
    assert binary == (1 if store.engine.dialect.name == "postgresql" else None)
