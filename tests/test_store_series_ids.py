"""SQLite's new series, numbered by the writer (``sqlite.NumberedSeries``), and migration 0010, which
drops the node index the unique identity index already covers."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, text

from fabricd.model import Batch, Kind
from fabricd.server import db
from fabricd.server.store import batchrows, new_series, sqlite, writer
from fabricd.server.store.records import SeriesLimitExceeded
from fabricd.server.store.storage import Storage
from fabricd.wire import decode, encode
from tests.support.points import raw_points
from tests.support.server import ib_sample, make_batch

T0 = 1_800_000_000.0
_ROW = "INSERT INTO series (id, node, source, device, port, counter, labels, name, unit, kind) VALUES "


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    e = db.make_engine(f"sqlite:///{tmp_path / 'fabricd.db'}")
    yield e
    e.dispose()


def _series(engine: Engine) -> list[tuple[int, str, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT id, node, device FROM series ORDER BY id"))]


def test_new_series_take_the_ids_sqlite_would_choose_in_the_batchs_order(engine: Engine) -> None:
    """The largest id plus one, then the next (a gap below it stays a gap), in the order of the
    batch's samples; the batch's points carry them, and the node's next batch finds them."""
    db.prepare(engine)
    with engine.begin() as conn:
        conn.execute(text(_ROW + "(4, 'n0', 'infiniband', 'x', '1', 'c', '{}', 'c', 'packets', 'counter')"))
    store = Storage.open(engine)
    first = [ib_sample(T0, device=d) for d in ("mlx5_2", "mlx5_0", "mlx5_1")]
    columns = decode(encode(make_batch("n1", "a", first)), gzipped=True, columnar=True)  # as ingest does
    assert store.writer.ingest(columns, T0, 10).new_series == 3
    assert _series(engine) == [(4, "n0", "x"), (5, "n1", "mlx5_2"), (6, "n1", "mlx5_0"), (7, "n1", "mlx5_1")]
    again = [ib_sample(T0 + 10, device=d) for d in ("mlx5_0", "mlx5_3", "mlx5_2")]
    assert store.writer.ingest(make_batch("n1", "b", again, seq=2), T0 + 10, 10).new_series == 1
    assert _series(engine)[-1] == (8, "n1", "mlx5_3")
    assert [(sid, ts) for _, sid, ts, *_ in raw_points(engine)] == [
        (5, T0),
        (6, T0),
        (7, T0),
        (6, T0 + 10),
        (8, T0 + 10),
        (5, T0 + 10),
    ]


def test_a_series_another_writer_stored_first_takes_no_number_and_the_others_are_read_back(engine: Engine) -> None:
    """``ON CONFLICT DO NOTHING`` skips it: the rows that went in keep their numbers (a gap where the
    skipped one would have been), and the skipped one comes back as None, in the rows' order."""
    db.prepare(engine)
    with engine.begin() as conn:
        conn.execute(text(_ROW + "(1, 'n1', 'infiniband', 'mlx5_1', '1', 'c', '{}', 'c', 'packets', 'counter')"))
    rows = [("n1", "infiniband", f"mlx5_{i}", "1", "c", "{}", "c", "packets", "counter") for i in range(3)]
    con = sqlite3.connect(engine.url.database, isolation_level=None)
    try:
        cur = con.cursor()
        cur.execute("BEGIN IMMEDIATE")
        returned = sqlite.STATEMENTS.insert_series.run(cur, rows)
        cur.execute("COMMIT")
    finally:
        con.close()
    assert returned == [2, None, 4]
    assert _series(engine) == [(1, "n1", "mlx5_1"), (2, "n1", "mlx5_0"), (4, "n1", "mlx5_2")]


def test_migration_0010_drops_the_node_index_and_a_nodes_series_are_still_found_by_index(engine: Engine) -> None:
    def indexes() -> set[str]:
        with engine.connect() as conn:
            return set(
                conn.execute(
                    text("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'series'")
                ).scalars()
            )

    cfg = db.alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0009")
    assert "ix_series_node" in indexes()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0010")
    assert "ix_series_node" not in indexes()
    with engine.connect() as conn:
        cur = conn.connection.cursor()
        plan = " ".join(str(r[-1]) for r in cur.execute("EXPLAIN QUERY PLAN " + sqlite.STATEMENTS.node_series, ("n1",)))
    # The writer's read of a node's series: a search of the unique (node, ...) index, which holds
    # every column it reads (the table is not even visited), no scan.
    assert plan == "SEARCH series USING COVERING INDEX sqlite_autoindex_series_1 (node=?)"
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0009")
    assert "ix_series_node" in indexes()


def _decoded(node: str, batch_id: str, samples: list, seq: int) -> Batch:
    """As ingest decodes a batch: its samples as columns."""
    return decode(encode(make_batch(node, batch_id, samples, seq=seq)), gzipped=True, columnar=True)


def test_a_nodes_batches_of_one_shape_reuse_its_series_ids_and_any_change_resolves_them_again(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer reuses the ids of a node's last batch when the next has the same series in the
    same order (``batchrows.shape_of``); the points still land on their own series when the order,
    the labels or the set changes, on another node with the same shape, and after a refused
    batch, whose new series must not be remembered."""
    db.prepare(engine)
    store = Storage.open(engine)
    devices = ("mlx5_0", "mlx5_1", "mlx5_2")
    pfc = [("priority", "3")]

    def scrape(ts: float, order: tuple[str, ...], labels: list[tuple[str, str]] | None = None) -> list:
        return [ib_sample(ts, device=d, labels=labels if d == "mlx5_1" and labels else ()) for d in order]

    looked_up: list[int] = []  # batches whose ids were looked up one by one, by size
    real = writer.series_ids
    for module in (writer, new_series):  # the writer's lookup, and the one after adding series
        monkeypatch.setattr(
            module, "series_ids", lambda samples, ids: looked_up.append(len(samples)) or real(samples, ids)
        )
    ingest = store.writer.ingest
    assert ingest(_decoded("n1", "a", scrape(T0, devices), 1), T0, 10).new_series == 3
    assert ingest(_decoded("n1", "b", scrape(T0 + 10, devices), 2), T0 + 10, 10).new_series == 0
    assert ingest(_decoded("n2", "a", scrape(T0 + 10, devices), 1), T0 + 10, 10).new_series == 3
    assert ingest(_decoded("n1", "c", scrape(T0 + 20, devices[::-1]), 3), T0 + 20, 10).new_series == 0
    assert ingest(_decoded("n1", "c2", scrape(T0 + 25, devices), 8), T0 + 25, 10).new_series == 0
    assert ingest(_decoded("n1", "d", scrape(T0 + 30, devices, pfc), 4), T0 + 30, 10).new_series == 1
    assert ingest(_decoded("n1", "e", scrape(T0 + 40, devices, pfc), 5), T0 + 40, 10).new_series == 0
    grown = (*devices, "mlx5_3")
    with pytest.raises(SeriesLimitExceeded):  # a fifth series over a limit of four: nothing kept
        ingest(_decoded("n1", "f", scrape(T0 + 50, grown, pfc), 6), T0 + 50, 4)
    assert ingest(_decoded("n1", "g", scrape(T0 + 50, grown, pfc), 6), T0 + 50, 10).new_series == 1
    assert ingest(_decoded("n1", "h", scrape(T0 + 60, grown, pfc), 7), T0 + 60, 10).new_series == 0

    with engine.connect() as conn:
        series = {
            sid: (node, dev, labels)
            for sid, node, dev, labels in conn.execute(text("SELECT id, node, device, labels FROM series"))
        }
    stored = sorted((ts, series[sid]) for _, sid, ts, *_ in raw_points(engine))
    plain, labelled = "{}", '{"priority":"3"}'
    expected = [(T0, ("n1", d, plain)) for d in devices]
    expected += [(T0 + 10, (n, d, plain)) for n in ("n1", "n2") for d in devices]
    expected += [(ts, ("n1", d, plain)) for ts in (T0 + 20, T0 + 25) for d in devices]
    for ts in (T0 + 30, T0 + 40):
        expected += [(ts, ("n1", d, labelled if d == "mlx5_1" else plain)) for d in devices]
    for ts in (T0 + 50, T0 + 60):
        expected += [(ts, ("n1", d, labelled if d == "mlx5_1" else plain)) for d in grown]
    assert stored == sorted(expected)
    assert len(series) == 3 + 3 + 1 + 1  # n1's three and one labelled and mlx5_3; n2's three
    # Looked up: a and n2's a once (each a first scrape: its ids are the inserted ones), c and c2
    # once, d twice (before and after adding a series to known ones), f once (refused when
    # adding), g twice; reused: b, e and h.
    assert looked_up == [3] * 6 + [4] * 3


class _Heard:
    """A writer listener: every ``Committed`` it was handed."""

    def __init__(self) -> None:
        self.batches: list = []

    def committed(self, batches: list) -> None:
        self.batches.extend(batches)


_SERIES = "SELECT id, node, source, device, port, counter, name, unit, kind, labels FROM series ORDER BY id"


def _first_scrape(ts: float) -> list:
    """A node's first scrape: labelled series (two label sets, given unsorted), one without a
    metric name (its counter names it), a gauge."""
    return [
        ib_sample(ts, device="mlx5_0"),
        ib_sample(ts, device="mlx5_0", counter="rx_prio3_pause", name="", labels=[("prio", "3"), ("dir", "rx")]),
        ib_sample(ts, device="mlx5_1", labels=[("b", "2"), ("a", "1")]),
        ib_sample(ts, device="mlx5_1", counter="link_state", name="", unit="state", kind=Kind.GAUGE, rate=None),
    ]


def test_a_first_scrape_is_stored_and_announced_as_the_row_path_stores_it(tmp_path: Path) -> None:
    """A node's first scrape, decoded as columns, takes the column-wise path (``first_scrape``);
    the same batch as a list of samples takes the row path. Both databases must end up with the
    same series rows, ids, points and announced series rows, and the announced rows must be the
    table's."""
    seen = []
    for columnar in (True, False):
        engine = db.make_engine(f"sqlite:///{tmp_path / f'{columnar}.db'}")
        try:
            db.prepare(engine)
            store, heard = Storage.open(engine), _Heard()
            store.writer.subscribe(heard)
            batch = make_batch("n1", "a", _first_scrape(T0))
            if columnar:
                batch = decode(encode(batch), gzipped=True, columnar=True)
                assert batchrows.first_scrape("n1", batch.samples, [None] * 4) is not None  # the path under test
            assert store.writer.ingest(batch, T0, 10).new_series == 4
            with engine.connect() as conn:
                table = [tuple(r) for r in conn.execute(text(_SERIES))]
            [committed] = heard.batches
            assert sorted(committed.series) == table  # (id, node, identity, name, unit, kind, labels)
            assert committed.sids == (1, 2, 3, 4)
            seen.append((table, [(sid, ts) for _, sid, ts, *_ in raw_points(engine)]))
        finally:
            engine.dispose()
    assert seen[0] == seen[1]
    table, points = seen[0]
    assert [(r[3], r[5], r[6], r[9]) for r in table] == [
        ("mlx5_0", "port_xmit_data", "port_transmit_data", "{}"),
        ("mlx5_0", "rx_prio3_pause", "rx_prio3_pause", '{"dir":"rx","prio":"3"}'),
        ("mlx5_1", "port_xmit_data", "port_transmit_data", '{"a":"1","b":"2"}'),
        ("mlx5_1", "link_state", "link_state", "{}"),
    ]
    assert points == [(1, T0), (2, T0), (3, T0), (4, T0)]


def test_a_first_scrape_with_a_series_twice_stores_it_once(engine: Engine) -> None:
    """Two samples of one series in a node's first batch: not the column-wise path (its ids
    would be two), one series, both points on it."""
    db.prepare(engine)
    store = Storage.open(engine)
    twice = [ib_sample(T0, device="mlx5_0"), ib_sample(T0, device="mlx5_1"), ib_sample(T0, device="mlx5_0")]
    batch = _decoded("n1", "a", twice, 1)
    assert batchrows.first_scrape("n1", batch.samples, [None] * 3) is None
    assert store.writer.ingest(batch, T0, 10).new_series == 2
    assert _series(engine) == [(1, "n1", "mlx5_0"), (2, "n1", "mlx5_1")]
    assert [sid for _, sid, *_ in raw_points(engine)] == [1, 2, 1]


def test_a_first_scrape_whose_series_another_writer_stored_meanwhile_takes_its_ids(engine: Engine) -> None:
    """The writer holds the node as having no series; another writer (a replica) stores one of
    them before the node's first scrape. That series is an ``ON CONFLICT`` no-op: the batch
    creates the other two, its point lands on the stored id, and only the two it created are
    announced."""
    db.prepare(engine)
    store, heard = Storage.open(engine), _Heard()
    store.writer.subscribe(heard)
    assert store.writer.ingest(make_batch("n1", "empty", []), T0, 10).new_series == 0  # the node, cached empty
    with engine.begin() as conn:
        conn.execute(
            text(
                _ROW + "(50, 'n1', 'infiniband', 'mlx5_1', '1', 'port_xmit_data', '{}', "
                "'port_transmit_data', 'bytes', 'counter')"
            )
        )
    batch = _decoded("n1", "a", [ib_sample(T0, device=d) for d in ("mlx5_0", "mlx5_1", "mlx5_2")], 2)
    assert batchrows.first_scrape("n1", batch.samples, [None] * 3) is not None  # the path under test
    assert store.writer.ingest(batch, T0, 10).new_series == 2
    assert _series(engine) == [(50, "n1", "mlx5_1"), (51, "n1", "mlx5_0"), (53, "n1", "mlx5_2")]
    assert [sid for _, sid, *_ in raw_points(engine)] == [51, 50, 53]
    assert [s[0] for s in heard.batches[-1].series] == [51, 53]
    assert heard.batches[-1].sids == (51, 50, 53)
    again = _decoded("n1", "b", [ib_sample(T0 + 10, device=d) for d in ("mlx5_0", "mlx5_1", "mlx5_2")], 3)
    assert store.writer.ingest(again, T0 + 10, 10).new_series == 0
    assert [sid for _, sid, *_ in raw_points(engine)][-3:] == [51, 50, 53]


def test_equal_shapes_of_two_nodes_are_kept_as_one_interned_tuple() -> None:
    """``kept_shape``: two nodes' batches decode their strings as their own objects; what the
    writer keeps for them is one tuple, its strings interned, so a fleet pays for its shape once."""

    def shape(node: str) -> batchrows.Shape:
        batch = _decoded(node, "a", [ib_sample(T0, device=d) for d in ("mlx5_0", "mlx5_1")], 1)
        got = batchrows.shape_of(batch.samples)
        assert got is not None
        return got

    one, two = shape("k1"), shape("k2")
    assert one == two and one[1][0] is not two[1][0]  # equal, each batch its own strings
    kept = batchrows.kept_shape(one)
    assert batchrows.kept_shape(two) is kept and kept == one
    assert kept[1][0] is sys.intern("mlx5_0")
