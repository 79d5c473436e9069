"""PostgreSQL's raw chunks and folded points in time partitions (fabricd/server/store/partitions.py,
chunk_fold.py), on the real server: the migrations on an empty and on a populated database,
partitions created ahead, retention by dropping whole partitions, folding whole partitions, and
no point lost or misplaced at a partition boundary."""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic import command
from sqlalchemy import Connection, Engine, text

from fabricd.model import Kind
from fabricd.server import db
from fabricd.server.store import chunk_fold, partitions
from fabricd.server.store.maintenance import downsample
from fabricd.server.store.storage import Storage
from tests.helpers import skip_or_fail
from tests.support.points import raw_points
from tests.support.server import ib_sample, make_batch, pg_engine, pg_reachable

pytestmark = pytest.mark.postgres

W = 1800.0  # partition width in these tests: half an hour, so a few hours of points span several
T0 = 1_800_000_000.0  # a multiple of W: partition starts fall on T0 + k * W


@pytest.fixture
def engine() -> Iterator[Engine]:
    if not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    with pg_engine() as e:
        yield e


def where(engine: Engine) -> dict[int, str]:
    """Raw point id -> the partition of ``point_chunks`` that holds it."""
    with engine.connect() as conn:
        chunks = conn.execute(text("SELECT id, count, tableoid::regclass::text FROM point_chunks")).all()
    return {i: str(t) for last, count, t in chunks for i in range(last - count + 1, last + 1)}


def last_point(engine: Engine, node: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT last_point_id FROM nodes WHERE name = :n"), {"n": node}).scalar_one())


def names(engine: Engine, parent: partitions.Parent = partitions.CHUNKS) -> list[str]:
    with engine.connect() as conn:
        return [p.name for p in partitions.partitions(conn, parent)]


def oids(conn: Connection, tables: list[str]) -> list[int]:
    return [int(conn.execute(text("SELECT CAST(CAST(:t AS regclass) AS oid)"), {"t": t}).scalar() or 0) for t in tables]


def starts(*ks: int, parent: partitions.Parent = partitions.CHUNKS) -> list[str]:
    return [partitions.name_of(T0 + k * W, parent) for k in ks]


def store_points(store: Storage, node: str, times: list[float], batch: str) -> None:
    samples = [ib_sample(ts, device=f"mlx5_{i % 4}", value=float(i), rate=float(i % 3)) for i, ts in enumerate(times)]
    store.writer.ingest(make_batch(node, batch, samples), T0, 10_000)


def test_an_empty_database_gets_the_partitioned_table_its_current_partitions_and_a_default(engine: Engine) -> None:
    import time

    before = time.time()
    assert db.prepare(engine) == db.head_revision()
    with engine.connect() as conn:
        assert partitions.is_partitioned(conn)
        found = [partitions.partitions(conn, parent) for parent in (partitions.POINTS, partitions.CHUNKS)]
        defaults = conn.execute(
            text("SELECT to_regclass('points_default') IS NOT NULL, to_regclass('point_chunks_default') IS NOT NULL")
        ).one()
    first = partitions.aligned(before)
    width = partitions.PARTITION_SECONDS
    for parts in found:
        assert [(p.start, p.end) for p in parts] == [(first + k * width, first + (k + 1) * width) for k in range(3)]
    assert tuple(defaults) == (True, True)


def test_partitions_are_created_ahead_and_strays_move_into_theirs(engine: Engine) -> None:
    db.prepare(engine)
    store = Storage.open(engine, partition_seconds=W)
    # Stored before any partition of that time exists: into the default partition, a chunk for
    # each partition's time (the writer cuts a batch at partition boundaries).
    store_points(store, "n1", [T0 + 10.0, T0 + W + 10.0], "early")
    assert where(engine) == {1: "point_chunks_default", 2: "point_chunks_default"}
    store.maintenance.prepare(T0 + 60.0)
    # The current partition and AHEAD more; the strays moved into theirs (T0 + W is one of them).
    assert names(engine)[-3:] == starts(0, 1, 2)
    assert names(engine, partitions.POINTS)[-3:] == starts(0, 1, 2, parent=partitions.POINTS)
    assert [where(engine)[i] for i in (1, 2)] == starts(0, 1)
    # Time moves on: the next maintenance creates the partitions ahead of the new now, once.
    store.maintenance.prepare(T0 + 2 * W + 5.0)
    store.maintenance.prepare(T0 + 2 * W + 6.0)
    assert names(engine)[-5:] == starts(0, 1, 2, 3, 4)
    assert names(engine, partitions.POINTS)[-5:] == starts(0, 1, 2, 3, 4, parent=partitions.POINTS)


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
    # The node records its batch's last point id, split in runs (``update`` after the chunks) or
    # one chunk (``insert_marking``: the chunk and the node in one statement).
    assert last_point(engine, "n1") == 5
    store_points(store, "n1", [edge + 10], "one")
    assert last_point(engine, "n1") == 6 and sorted(where(engine)) == [1, 2, 3, 4, 5, 6]


def test_retention_drops_whole_partitions_and_deletes_no_row(engine: Engine) -> None:
    db.prepare(engine)
    store = Storage.open(engine, partition_seconds=W)
    store.maintenance.prepare(T0)
    store.maintenance.prepare(T0 + 3 * W)
    for k in range(4):  # 3 points a partition, T0 .. T0 + 4W
        store_points(store, "n1", [T0 + k * W + 1.0, T0 + k * W + W / 2, T0 + (k + 1) * W - 1.0], f"b{k}")
    with engine.begin() as conn:
        conn.execute(text("ANALYZE point_chunks"))  # the dropped-point count is the planner's estimate
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
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0010")
    rows = text("SELECT id, series_id, ts, value, status, tableoid::regclass::text FROM points ORDER BY id")
    with engine.connect() as conn:
        after = conn.execute(rows).all()
        assert partitions.is_partitioned(conn)
    # 0005: the same rows, each in the partition of its time.
    assert [tuple(r[:5]) for r in after] == [tuple(r) for r in before]
    assert [r[5] for r in after] == [
        partitions.name_of(partitions.aligned(times[0])),
        partitions.name_of(partitions.aligned(times[1])),
        "points_default",
    ]
    # 0011: the raw rows are chunks, with their ids and values, in the chunk partitions of their time.
    assert db.prepare(engine) == db.head_revision()
    assert [(p[0], p[1], p[2], p[3], p[5]) for p in raw_points(engine)] == [tuple(r) for r in before]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM points")).scalar() == 0
    assert where(engine) == {
        1: partitions.name_of(partitions.aligned(times[0]), partitions.CHUNKS),
        2: partitions.name_of(partitions.aligned(times[1]), partitions.CHUNKS),
        3: "point_chunks_default",
    }
    # The id sequence goes on where it was: the next stored point is point 4.
    store = Storage.open(engine)
    store_points(store, "n1", [now], "after")
    assert max(where(engine)) == 4
    # Back down to 0010: the chunks are rows of ``points`` again, with their ids and values.
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0010")
    with engine.connect() as conn:
        again = conn.execute(text("SELECT id, series_id, ts, value, status, step FROM points ORDER BY id")).all()
        gone = conn.execute(text("SELECT to_regclass('point_chunks'), to_regproc('fabricd_point_ids')")).one()
    assert [tuple(r[:5]) for r in again[:3]] == [tuple(r) for r in before] and len(again) == 4
    assert {r[5] for r in again} == {0.0} and tuple(gone) == (None, None)


def test_chunks_stored_while_their_partition_folds_stay_raw_in_its_place(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fold reads a partition's chunks up to its newest id, then locks the parent: a chunk
    committed in between (a backlog late by hours) is neither folded nor lost, but waits raw in
    the table that takes the partition's place, for the next fold."""
    db.prepare(engine)
    store = Storage.open(engine, stream_tail_points=0, partition_seconds=W)
    store.maintenance.prepare(T0)
    store.writer.ingest(make_batch("n1", "on-time", [ib_sample(T0 + 10.0 * i) for i in range(6)]), T0, 10)
    fold_node = chunk_fold._fold_node

    def late_meanwhile(cur: Any, p: partitions.Partition, node: str, hi: int, step: float) -> Any:
        # another connection's batch, committed now
        store.writer.ingest(make_batch("n1", "late", [ib_sample(T0 + 100.0)]), T0, 10)
        return fold_node(cur, p, node, hi, step)

    monkeypatch.setattr(chunk_fold, "_fold_node", late_meanwhile)
    now = T0 + 3 * W
    report = store.maintenance.run(now, raw_retention=W, step=60.0, retention=10 * W)
    monkeypatch.undo()
    assert (report.downsampled_points, report.buckets_written) == (6, 1)
    assert where(engine) == {7: starts(0)[0]}
    [series] = store.inventory.find_series()
    points = store.inventory.points(series.id, 0, now)
    assert [(p.ts, p.step) for p in points] == [(T0, 60.0), (T0 + 100.0, 0.0)]
    again = store.maintenance.run(now, raw_retention=W, step=60.0, retention=10 * W)
    assert (again.downsampled_points, again.buckets_written) == (1, 1)
    assert starts(0)[0] not in names(engine) and 7 not in where(engine)


def test_replicas_taking_id_blocks_at_once_never_share_an_id(engine: Engine) -> None:
    """``fabricd_point_ids(n)`` (migration 0011) is ``nextval`` and ``setval`` under an advisory
    lock: sessions taking blocks at the same time get disjoint, consecutive blocks."""
    db.prepare(engine)
    rng = random.Random(7)
    sizes = [[rng.randint(1, 480) for _ in range(150)] for _ in range(4)]

    def take(mine: list[int]) -> list[range]:
        with engine.connect() as conn:
            cur = conn.connection.cursor()
            blocks = []
            for n in mine:
                cur.execute("SELECT fabricd_point_ids(%s), lastval()", (n,))
                last, lastval = cur.fetchone()
                assert lastval == last  # the writer reads the batch's last id from lastval()
                blocks.append(range(last - n + 1, last + 1))
            conn.commit()
            return blocks

    with ThreadPoolExecutor(4) as pool:
        blocks = [b for found in pool.map(take, sizes) for b in found]
    ids = sorted(i for b in blocks for i in b)
    assert ids == list(range(1, sum(map(sum, sizes)) + 1))


def test_a_replica_of_the_release_before_cannot_store_raw_rows_no_reader_would_see(engine: Engine) -> None:
    """Mixed-version rollout across migration 0011: a replica still on the release before writes a
    batch's raw points as rows of ``points`` by ``COPY``. The migrated table refuses them, so that
    batch fails and its agent keeps it, rather than being stored where no reader looks."""
    db.prepare(engine)
    store = Storage.open(engine, partition_seconds=W)
    store.maintenance.prepare(T0)
    store.writer.ingest(make_batch("n1", "new", [ib_sample(T0)]), T0, 10)
    old_copy = "COPY points (series_id, ts, value, rate, status, since) FROM STDIN (FORMAT BINARY)"
    with engine.connect() as conn:
        cur = conn.connection.cursor()
        with pytest.raises(psycopg.errors.CheckViolation, match="points_folded_only"), cur.copy(old_copy) as copy:
            copy.set_types(["int8", "float8", "float8", "float8", "text", "float8"])
            copy.write_row((1, T0 + 10.0, 1.0, 1.0, "ok", None))
        conn.rollback()
    assert [p[0] for p in raw_points(engine)] == [1]
