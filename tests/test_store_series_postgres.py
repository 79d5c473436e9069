"""PostgreSQL's new series (``postgres.JoinedSeries``): a plain insert of joined columns inside a
savepoint, and the ``ON CONFLICT`` path where a series another replica stored meanwhile, a column
holding the separator, a small addition or too many savepoints in one transaction rule it out. Each
case must store exactly what the ``ON CONFLICT`` path stores, with the ids the table holds."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import Engine, text

from fabricd.model import Batch, Kind
from fabricd.server.store import postgres
from fabricd.server.store.storage import Storage
from fabricd.wire import decode, encode
from tests.support.points import raw_points
from tests.support.server import Heard, ib_sample, make_batch

pytestmark = pytest.mark.postgres

T0 = 1_800_000_000.0
_SERIES = "SELECT id, node, source, device, port, counter, labels, name, unit, kind FROM series ORDER BY id"


@pytest.fixture
def engine(pg_migrated: Engine) -> Engine:
    return pg_migrated


class _Counted:
    """The ``ON CONFLICT`` writer, counting the calls that reach it."""

    def __init__(self) -> None:
        joined = postgres.STATEMENTS.insert_series
        assert isinstance(joined, postgres.JoinedSeries)
        self.inner = joined.fallback
        self.calls = 0

    def run(self, cur: Any, rows: Sequence[tuple[Any, ...]]) -> list[int | None]:
        self.calls += 1
        return self.inner.run(cur, rows)


def _rows(node: str, devices: int = 8, counters: int = 10, device: str = "mlx5_{}") -> list[tuple[str, ...]]:
    """A node's new series rows in ``SERIES_COLUMNS`` order: node, source, device, port, counter,
    labels, name, unit, kind."""
    return [
        (node, "infiniband", device.format(d), "1", f"c{c:02d}", "{}", f"c{c:02d}", "packets", "counter")
        for d in range(devices)
        for c in range(counters)
    ]


def _table(engine: Engine) -> dict[tuple[str, ...], int]:
    with engine.connect() as conn:
        return {tuple(r[1:]): r[0] for r in conn.execute(text(_SERIES))}


def _scrape(node: str, ts: float, devices: int = 8, counters: int = 10) -> Batch:
    samples = [
        ib_sample(ts, device=f"mlx5_{d}", counter=f"c{c:02d}", name=f"c{c:02d}", unit="packets", kind=Kind.COUNTER)
        for d in range(devices)
        for c in range(counters)
    ]
    return decode(encode(make_batch(node, f"{node}-{ts}", samples, ts)), gzipped=True, columnar=True)


def test_a_first_scrape_is_inserted_plainly_with_the_ids_the_table_holds(engine: Engine) -> None:
    """80 new series through the writer: no ``ON CONFLICT``; the announced rows are the table's,
    and each point lands on its own series' id, as the next scrape finds them."""
    counted = _Counted()
    joined = postgres.STATEMENTS.insert_series
    assert isinstance(joined, postgres.JoinedSeries)
    original, joined.fallback = joined.fallback, counted
    try:
        store = Storage.open(engine)
        heard = Heard()
        store.writer.subscribe(heard)
        assert store.writer.ingest(_scrape("n1", T0), T0, 1000).new_series == 80
        assert store.writer.ingest(_scrape("n1", T0 + 10), T0 + 10, 1000).new_series == 0
    finally:
        joined.fallback = original
    assert counted.calls == 0
    table = _table(engine)
    assert len(table) == 80
    [first, _] = heard.batches
    assert sorted(first.series) == sorted((sid, *key[:5], *key[6:], key[5]) for key, sid in table.items())
    expected = [table[("n1", "infiniband", f"mlx5_{d}", "1", f"c{c:02d}", "{}", f"c{c:02d}", "packets", "counter")]
                for d in range(8) for c in range(10)]  # fmt: skip
    assert first.sids == tuple(expected)
    assert [sid for _, sid, *_ in raw_points(engine)] == expected * 2


def test_a_series_another_replica_stored_meanwhile_rolls_back_to_the_savepoint_only(engine: Engine) -> None:
    """In one transaction, node a's series go in; another replica commits one of node b's series;
    b's plain insert then violates the unique identity, rolls back to its savepoint, and the
    ``ON CONFLICT`` path stores b's other series. a's rows, written before the savepoint, stay."""
    counted = _Counted()
    writer = postgres.JoinedSeries(counted)
    with contextlib.closing(engine.raw_connection()) as raw:
        cur = raw.cursor()
        a_ids = writer.run(cur, _rows("a"))
        with engine.begin() as other:
            other.execute(
                text(
                    "INSERT INTO series (node, source, device, port, counter, labels, name, unit, kind) "
                    "VALUES ('b', 'infiniband', 'mlx5_3', '1', 'c04', '{}', 'c04', 'packets', 'counter')"
                )
            )
        b_ids = writer.run(cur, _rows("b"))
        raw.commit()
    assert counted.calls == 1
    table = _table(engine)
    assert len(table) == 160
    assert a_ids == [table[row] for row in _rows("a")]
    stored_first = table[("b", "infiniband", "mlx5_3", "1", "c04", "{}", "c04", "packets", "counter")]
    assert b_ids == [None if row[2:5] == ("mlx5_3", "1", "c04") else table[row] for row in _rows("b")]
    assert stored_first not in b_ids


def test_a_separator_in_a_value_or_a_small_addition_takes_the_on_conflict_path(engine: Engine) -> None:
    """A device name holding the separator would split into two values: its rows go as arrays and
    are stored exactly. Ten series are fewer than the extra round trips are worth."""
    counted = _Counted()
    writer = postgres.JoinedSeries(counted)
    hostile = _rows("n1", device="mlx5\x1f{}")
    small = _rows("n2", devices=1)
    with contextlib.closing(engine.raw_connection()) as raw:
        cur = raw.cursor()
        hostile_ids, small_ids = writer.run(cur, hostile), writer.run(cur, small)
        raw.commit()
    assert counted.calls == 2
    table = _table(engine)
    assert hostile_ids == [table[row] for row in hostile]
    assert small_ids == [table[row] for row in small]
    assert len(table) == len(hostile) + len(small)


def test_past_the_savepoint_cap_a_transaction_takes_the_on_conflict_path(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most ``MAX_SAVEPOINTS`` plain inserts in one transaction (its subtransactions), then
    ``ON CONFLICT``; the writer's next transaction (a new cursor) starts counting again."""
    monkeypatch.setattr(postgres.JoinedSeries, "MAX_SAVEPOINTS", 2)
    counted = _Counted()
    writer = postgres.JoinedSeries(counted)
    with contextlib.closing(engine.raw_connection()) as raw:
        cur = raw.cursor()
        ids = [writer.run(cur, _rows(node)) for node in ("a", "b", "c")]
        raw.commit()
        assert counted.calls == 1
        ids.append(writer.run(raw.cursor(), _rows("d")))
        raw.commit()
    assert counted.calls == 1
    table = _table(engine)
    assert len(table) == 320
    assert ids == [[table[row] for row in _rows(node)] for node in "abcd"]
