"""SQLite's raw points in chunks (fabricd/server/store/chunks.py, migration 0008): the packing round
trips every value, an existing database's points move into chunks with their ids, ids never go back,
and maintenance folds part of a chunk without losing the rest."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest
from alembic import command
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from fabricd.model import Status
from fabricd.server import db
from fabricd.server.store import chunks
from fabricd.server.store.records import PointRow
from fabricd.server.store.storage import Storage
from tests.support.points import raw_points
from tests.support.server import ib_sample, make_batch

T0 = 1_800_000_000.0


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    e = db.make_engine(f"sqlite:///{tmp_path / 'fabricd.db'}")
    yield e
    e.dispose()


def test_a_chunk_gives_back_every_value_to_the_bit() -> None:
    rows = [
        (1, T0 + 0.1, 2.0**53 + 2, 1 / 3, "ok", None),
        (2**40, T0 - 1e-6, -0.0, None, "first", None),
        (3, T0, 1e308, 5e-324, "saturated", T0 - 60.0),
        (4, 0.0, -1.5, 0.0, "wrapped", None),
        (5, T0, 7.0, None, "reset", None),
    ]
    blob, lo, hi = chunks.pack(rows)
    got = chunks.unpack(104, len(rows), blob)
    assert [p[0] for p in got] == [100, 101, 102, 103, 104]
    assert [p[1:] for p in got] == rows
    assert math.copysign(1.0, got[1][3]) == -1.0  # -0.0 keeps its sign
    assert (lo, hi) == (0.0, T0 + 0.1)
    assert chunks.rows(blob, len(rows)) == rows  # the latest values' rows: no point ids
    assert chunks.rows(blob, len(rows), keep={2**40, 5, 77}) == [rows[1], rows[4]]
    assert chunks.series_times(blob, len(rows)) == ([r[0] for r in rows], [r[1] for r in rows])
    with pytest.raises(ValueError, match="point chunk 104 holds"):
        chunks.unpack(104, len(rows) + 1, blob)


def _packed_point_by_point(rows: list[PointRow]) -> bytes:
    """The chunk format written the plain way, one point at a time (the layout ``pack`` keeps)."""
    codes = {s: i for i, s in enumerate(x.value for x in Status)}
    nan = float("nan")
    out = b"".join(struct.pack("<q", r[0]) for r in rows)
    for i, none_as_nan in ((1, False), (2, False), (3, True), (5, True)):
        out += b"".join(struct.pack("<d", nan if r[i] is None and none_as_nan else r[i]) for r in rows)
    return out + bytes(codes[r[4]] for r in rows)


_times = st.sampled_from([T0, T0 + 10.0, 0.0, -0.0]) | st.floats(allow_nan=False)
_optional = st.none() | st.floats(allow_nan=False)
_row = st.tuples(
    st.integers(-(2**63), 2**63 - 1),
    _times,
    st.floats(),
    _optional,
    st.sampled_from([x.value for x in Status]),
    _optional,
)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(_row, min_size=1, max_size=30) | st.builds(lambda r, n: [r] * n, _row, st.integers(1, 30)))
def test_packing_whole_columns_writes_what_packing_point_by_point_writes(rows: list[PointRow]) -> None:
    """The whole-column fast paths (one time, every status ok, no since, every rate) against the
    plain pass, byte for byte: from rows, and from the columns a decoded batch holds."""
    blob, lo, hi = chunks.pack(rows)
    assert blob == _packed_point_by_point(rows)
    assert chunks.pack_columns(*zip(*rows, strict=True)) == (blob, lo, hi)
    times = [r[1] for r in rows]
    assert (lo, hi) == (min(times), max(times))


def test_the_migration_moves_raw_points_into_chunks_with_their_ids(engine: Engine) -> None:
    with engine.begin() as conn:
        cfg = db.alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0007")
        conn.execute(
            text(
                "INSERT INTO series (id, node, source, device, port, counter, labels, name, unit, kind) VALUES "
                "(1, 'n1', 'infiniband', 'mlx5_0', '1', 'c', '{}', 'c', 'packets', 'counter'), "
                "(2, 'n2', 'infiniband', 'mlx5_0', '1', 'c', '{}', 'c', 'packets', 'counter')"
            )
        )
        # As revision 0007 stored them: n1's batch (ids 1-2), n2's (3), a folded point (4), n1's
        # next batch (5-6), and an orphan whose series is gone (7).
        for sid, ts, value, step in [
            (1, T0, 1.0, 0.0),
            (1, T0 + 1, 2.0, 0.0),
            (2, T0, 3.0, 0.0),
            (1, T0 - 3600, 9.0, 60.0),
            (1, T0 + 10, 5.0, 0.0),
            (1, T0 + 11, 6.0, 0.0),
            (99, T0, 7.0, 0.0),
        ]:
            conn.execute(
                text(
                    "INSERT INTO points (series_id, ts, value, rate, status, since, step) "
                    "VALUES (:sid, :ts, :v, 0.5, 'ok', NULL, :step)"
                ),
                {"sid": sid, "ts": ts, "v": value, "step": step},
            )
        before = conn.execute(
            text("SELECT id, series_id, ts, value, rate, status, since FROM points WHERE step = 0.0 ORDER BY id")
        ).all()
    assert db.prepare(engine) == db.head_revision()
    assert raw_points(engine) == [tuple(r) for r in before]
    with engine.connect() as conn:
        cut = conn.execute(text("SELECT id, count, node FROM point_chunks ORDER BY id")).all()
        left = conn.execute(text("SELECT id, step FROM points")).all()
    assert [tuple(c) for c in cut] == [(2, 2, "n1"), (3, 1, "n2"), (6, 2, "n1"), (7, 1, "")]
    assert [tuple(r) for r in left] == [(4, 60.0)]  # folded points stay rows
    # The next batch's ids go on above every id the table gave, the folded point's included.
    store = Storage.open(engine)
    store.writer.ingest(make_batch("n3", "b", [ib_sample(T0 + 20), ib_sample(T0 + 20, device="d1")]), T0, 10)
    assert [p[0] for p in raw_points(engine)][-2:] == [8, 9]
    assert store.stream.head() == 9
    # Back to 0007: the chunks are rows again, with their ids.
    every = raw_points(engine)
    with engine.begin() as conn:
        cfg = db.alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0007")
        rows = conn.execute(
            text("SELECT id, series_id, ts, value, rate, status, since FROM points WHERE step = 0.0 ORDER BY id")
        ).all()
    assert [tuple(r) for r in rows] == every


def test_ids_never_go_back_when_every_chunk_is_gone(engine: Engine) -> None:
    db.prepare(engine)
    store = Storage.open(engine)
    store.writer.ingest(make_batch("n1", "a", [ib_sample(T0 + i, device=f"d{i}") for i in range(3)]), T0, 10)
    report = store.maintenance.run(T0 + 10 * 86400, raw_retention=600, step=60, retention=86400)
    assert report.downsampled_points == 3 and raw_points(engine) == []
    store.writer.ingest(make_batch("n1", "b", [ib_sample(T0 + 20 * 86400)]), T0, 10)
    assert [p[0] for p in raw_points(engine)] == [4]


def test_maintenance_folds_the_old_part_of_a_chunk_and_keeps_the_rest_with_their_ids(engine: Engine) -> None:
    """A spooled backlog's batch spans its hours: the points past the cutoff stay raw, readable by
    the stream and the series' history with their own ids."""
    db.prepare(engine)
    store = Storage.open(engine)
    pts = [ib_sample(T0 + 30 * i, value=float(i), rate=1.0) for i in range(8)]  # 0..210 s
    store.writer.ingest(make_batch("n1", "a", pts), T0, 10)
    store.writer.ingest(make_batch("n1", "b", [ib_sample(T0 + 300, value=9.0, rate=1.0)]), T0, 10)
    report = store.maintenance.run(T0 + 120 + 600, raw_retention=600, step=60, retention=1e9)
    assert (report.downsampled_points, report.buckets_written) == (4, 2)  # 0-90 s: buckets 0 and 60
    assert [(p[0], p[2]) for p in raw_points(engine)] == [
        (5, T0 + 120),
        (6, T0 + 150),
        (7, T0 + 180),
        (8, T0 + 210),
        (9, T0 + 300),
    ]
    deliveries, cursor = store.stream.read(6, limit=2)
    assert [s.ts for d in deliveries for s in d.samples] == [T0 + 180, T0 + 210] and cursor == 8
    [series] = store.inventory.find_series()
    history = store.inventory.points(series.id, T0, T0 + 1000)
    assert [(p.ts, p.step) for p in history] == [
        (T0, 60.0),
        (T0 + 60, 60.0),
        (T0 + 120, 0.0),
        (T0 + 150, 0.0),
        (T0 + 180, 0.0),
        (T0 + 210, 0.0),
        (T0 + 300, 0.0),
    ]
    again = store.maintenance.run(T0 + 120 + 600, raw_retention=600, step=60, retention=1e9)
    assert (again.downsampled_points, again.buckets_written) == (0, 0)
