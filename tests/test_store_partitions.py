"""PostgreSQL's points in time partitions (fabricd/server/store/partitions.py), on the real server:
the migration on an empty and on a populated database, partitions created ahead, retention by
dropping whole partitions, folding whole partitions, and no point lost at a partition boundary."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Connection, Engine, text

from fabricd.model import Kind
from fabricd.server import db
from fabricd.server.store import partitions
from fabricd.server.store.maintenance import downsample
from fabricd.server.store.storage import Storage
from tests.helpers import skip_or_fail
from tests.support.server import ib_sample, make_batch, pg_reachable, pg_schema

pytestmark = pytest.mark.postgres

W = 1800.0  # partition width in these tests: half an hour, so a few hours of points span several
T0 = 1_800_000_000.0  # a multiple of W: partition starts fall on T0 + k * W


@pytest.fixture
def engine() -> Iterator[Engine]:
    if not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    with pg_schema() as url:
        e = db.make_engine(url)
        try:
            yield e
        finally:
            e.dispose()


def where(engine: Engine) -> dict[int, str]:
    """Point id -> the table that holds it."""
    with engine.connect() as conn:
        return {int(i): str(t) for i, t in conn.execute(text("SELECT id, tableoid::regclass::text FROM points"))}


def names(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [p.name for p in partitions.partitions(conn)]


def oids(conn: Connection, tables: list[str]) -> list[int]:
    return [int(conn.execute(text("SELECT CAST(CAST(:t AS regclass) AS oid)"), {"t": t}).scalar() or 0) for t in tables]


def starts(*ks: int) -> list[str]:
    return [partitions.name_of(T0 + k * W) for k in ks]


def store_points(store: Storage, node: str, times: list[float], batch: str) -> None:
    samples = [ib_sample(ts, device=f"mlx5_{i % 4}", value=float(i), rate=float(i % 3)) for i, ts in enumerate(times)]
    store.writer.ingest(make_batch(node, batch, samples), T0, 10_000)


def test_an_empty_database_gets_the_partitioned_table_its_current_partitions_and_a_default(engine: Engine) -> None:
    import time

    before = time.time()
    assert db.prepare(engine) == db.head_revision()
    with engine.connect() as conn:
        assert partitions.is_partitioned(conn)
        found = partitions.partitions(conn)
        default = conn.execute(text("SELECT to_regclass('points_default') IS NOT NULL")).scalar()
    first = partitions.aligned(before)
    width = partitions.PARTITION_SECONDS
    assert [(p.start, p.end) for p in found] == [(first + k * width, first + (k + 1) * width) for k in range(3)]
    assert default is True


def test_partitions_are_created_ahead_and_strays_move_into_theirs(engine: Engine) -> None:
    db.prepare(engine)
    store = Storage.open(engine, partition_seconds=W)
    # Stored before any partition of that time exists: into the default partition.
    store_points(store, "n1", [T0 + 10.0, T0 + W + 10.0], "early")
    assert set(where(engine).values()) == {"points_default"}
    store.maintenance.prepare(T0 + 60.0)
    # The current partition and AHEAD more; the strays moved into theirs (T0 + W is one of them).
    assert names(engine)[-3:] == starts(0, 1, 2)
    assert sorted(where(engine).values()) == starts(0, 1)
    # Time moves on: the next maintenance creates the partitions ahead of the new now, once.
    store.maintenance.prepare(T0 + 2 * W + 5.0)
    store.maintenance.prepare(T0 + 2 * W + 6.0)
    assert names(engine)[-5:] == starts(0, 1, 2, 3, 4)


def test_no_point_is_lost_or_misplaced_at_a_partition_boundary(engine: Engine) -> None:
    db.prepare(engine)
    store = Storage.open(engine, stream_tail_points=0, partition_seconds=W)
    store.maintenance.prepare(T0)
    edge = T0 + W
    times = [edge - 1e-6, edge, edge + 1e-6, T0, T0 + 2 * W - 1e-6]
    store_points(store, "n1", times, "edge")
    placed = where(engine)
    assert sorted(placed) == [1, 2, 3, 4, 5]
    assert [placed[i] for i in range(1, 6)] == starts(0, 1, 1, 0, 1)
    # Read back whole through the parent, by series and time and by the stream.
    deliveries, cursor = store.stream.read(0, limit=100)
    assert [s.ts for d in deliveries for s in d.samples] == times and cursor == 5


def test_retention_drops_whole_partitions_and_deletes_no_row(engine: Engine) -> None:
    db.prepare(engine)
    store = Storage.open(engine, partition_seconds=W)
    store.maintenance.prepare(T0)
    store.maintenance.prepare(T0 + 3 * W)
    for k in range(4):  # 3 points a partition, T0 .. T0 + 4W
        store_points(store, "n1", [T0 + k * W + 1.0, T0 + k * W + W / 2, T0 + (k + 1) * W - 1.0], f"b{k}")
    with engine.begin() as conn:
        conn.execute(text("ANALYZE points"))  # the dropped-point count is the planner's estimate
    now = T0 + 4 * W
    with engine.connect() as conn:
        kept = oids(conn, starts(2, 3))
    # Raw kept 4 W (nothing folds), everything older than 2.5 W dropped: the partitions ending by then.
    report = store.maintenance.run(now, raw_retention=4 * W, step=60.0, retention=1.5 * W)
    assert names(engine)[:3] == starts(2, 3, 4)
    assert report.deleted_points == 6 and report.downsampled_points == 0
    # The partitions kept are the same tables, all their points in place: nothing was deleted
    # row by row or rewritten.
    assert sorted(where(engine).values()) == starts(2, 2, 2, 3, 3, 3)
    with engine.connect() as conn:
        assert oids(conn, starts(2, 3)) == kept


def test_a_partition_past_the_raw_retention_is_folded_whole_as_the_sqlite_path_folds(engine: Engine) -> None:
    db.prepare(engine)
    store = Storage.open(engine, stream_tail_points=10_000, partition_seconds=W)
    store.maintenance.prepare(T0)
    # 90 min of 10 s points for a counter and a gauge with gaps in their rates: partitions 0, 1, 2.
    counter = [ib_sample(T0 + i * 10, value=float(i), rate=float(i % 7) if i % 5 else None) for i in range(540)]
    gauge = [
        ib_sample(
            T0 + i * 10, counter="temp", name="temp", unit="celsius", kind=Kind.GAUGE, value=20.0 + i % 9, rate=None
        )
        for i in range(540)
    ]
    store.writer.ingest(make_batch("n1", "a", counter + gauge), T0, 100)
    now = T0 + 2 * W + 600.0
    report = store.maintenance.run(now, raw_retention=W, step=300.0, retention=10 * W)
    # The cutoff (now - W) lies inside partition 1: only partition 0 is wholly before it.
    assert (report.downsampled_points, report.buckets_written) == (360, 12)
    series = {s.reading.counter: s for s in store.inventory.find_series()}
    for name, samples in (("port_xmit_data", counter), ("temp", gauge)):
        points = store.inventory.points(series[name].id, 0, T0 + 10 * W)
        folded = [(p.ts, p.value, p.rate, p.status) for p in points if p.step == 300.0]
        raw = [(s.ts, s.reading.value, s.rate, s.status.value) for s in samples if s.ts < T0 + W]
        expected = downsample(raw, 300.0, counter=name == "port_xmit_data")
        assert folded == [(b["ts"], b["value"], b["rate"], b["status"]) for b in expected]
        assert [p.ts for p in points if p.step == 0] == [s.ts for s in samples if s.ts >= T0 + W]
    # Once: a second run folds nothing; the stream still hands out the raw points only, once.
    again = store.maintenance.run(now, raw_retention=W, step=300.0, retention=10 * W)
    assert (again.downsampled_points, again.buckets_written) == (0, 0)
    deliveries, _ = store.stream.read(0, limit=100_000)
    assert sum(len(d.samples) for d in deliveries) == 1080


def test_the_migration_partitions_an_existing_database_and_keeps_every_point(engine: Engine, tmp_path: Path) -> None:
    with engine.begin() as conn:
        cfg = db.alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0004")
    import time

    now = time.time()
    width = partitions.PARTITION_SECONDS
    # Points as revision 0004 stored them: now, one partition back, and one far older than history.
    times = [now - 5.0, now - width - 5.0, now - partitions.HISTORY_SECONDS - 100.0]
    with engine.begin() as conn:
        for i, ts in enumerate(times):
            conn.execute(
                text(
                    "INSERT INTO points (series_id, ts, value, rate, status, since, step) "
                    "VALUES (:sid, :ts, :v, NULL, 'ok', NULL, 0.0)"
                ),
                {"sid": 7, "ts": ts, "v": float(i)},
            )
        conn.execute(text("INSERT INTO cursors (name, position) VALUES ('detection', 3)"))
        before = conn.execute(text("SELECT id, series_id, ts, value, status FROM points ORDER BY id")).all()
    assert db.prepare(engine) == db.head_revision()
    with engine.connect() as conn:
        after = conn.execute(text("SELECT id, series_id, ts, value, status FROM points ORDER BY id")).all()
        assert partitions.is_partitioned(conn)
    assert after == before
    placed = where(engine)
    assert placed == {
        1: partitions.name_of(partitions.aligned(times[0])),
        2: partitions.name_of(partitions.aligned(times[1])),
        3: "points_default",
    }
    # The id sequence goes on where it was: the next stored point is point 4.
    store = Storage.open(engine)
    store_points(store, "n1", [now], "after")
    assert max(where(engine)) == 4
