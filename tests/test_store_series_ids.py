"""SQLite's new series, numbered by the writer (``sqlite.NumberedSeries``), and migration 0010, which
drops the node index the unique identity index already covers."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, text

from fabricd.server import db
from fabricd.server.store import sqlite
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
