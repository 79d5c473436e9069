"""PostgreSQL: a node's first batch stores its new series before it queues for the write lock
(``series_ahead.py``), beside the writer; two batches of one node take turns on the node's
advisory lock, so each series is stored once and the series limit holds; a batch refused after its
series were stored leaves them to its retry."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import Engine, text

from fabricd.model import Batch, Kind
from fabricd.server.store.records import IngestResult, SeriesLimitExceeded
from fabricd.server.store.storage import Storage
from fabricd.server.store.writer import GroupCommitWriter
from fabricd.wire import decode, encode
from tests.support.points import raw_points
from tests.support.server import Heard, ib_sample, make_batch

pytestmark = pytest.mark.postgres

T0 = 1_800_000_000.0


@pytest.fixture
def engine(pg_migrated: Engine) -> Engine:
    return pg_migrated


def _scrape(node: str, ts: float, devices: range = range(8), counters: int = 10) -> Batch:
    samples = [
        ib_sample(ts, device=f"mlx5_{d}", counter=f"c{c:02d}", name=f"c{c:02d}", unit="packets", kind=Kind.COUNTER)
        for d in devices
        for c in range(counters)
    ]
    return decode(encode(make_batch(node, f"{node}-{ts}-{devices}", samples, ts)), gzipped=True, columnar=True)


def _series(engine: Engine) -> dict[tuple[str, str, str], int]:
    """(node, device, counter) -> id, failing on an identity stored twice."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, node, device, counter FROM series ORDER BY id")).all()
    table = {(node, device, counter): sid for sid, node, device, counter in rows}
    assert len(table) == len(rows)
    return table


def _wait(what: str, ok: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_new_nodes_series_are_stored_while_another_batch_holds_the_write_lock(engine: Engine) -> None:
    """The write lock held (a group commit under way): node n1's first batch stores its 80 series
    meanwhile, then its points once the lock is free, on those ids, announced once."""
    store = Storage.open(engine)
    heard = Heard()
    store.writer.subscribe(heard)
    with ThreadPoolExecutor(1) as pool:
        with store.writer.db.write_lock:
            pending = pool.submit(store.writer.ingest, _scrape("n1", T0), T0, 1000)
            _wait("n1's series stored beside the held write lock", lambda: len(_series(engine)) == 80)
            assert not pending.done() and raw_points(engine) == []
        result = pending.result(timeout=30)
    assert (result.accepted, result.new_series) == (80, 80)
    table = _series(engine)
    expected = [table[("n1", f"mlx5_{d}", f"c{c:02d}")] for d in range(8) for c in range(10)]
    [announced] = heard.batches
    assert sorted(row[0] for row in announced.series) == sorted(table.values())
    assert announced.sids == tuple(expected)
    assert [sid for _, sid, *_ in raw_points(engine)] == expected


@pytest.mark.parametrize("limit", [1000, 100])
def test_two_first_batches_of_one_node_store_each_series_once_within_the_limit(engine: Engine, limit: int) -> None:
    """Two batches of a new node at once, devices 0-7 and 4-11 (120 series together): both
    stored when the limit allows 120 (each series once, 40 shared), else the one that came second
    to the node's lock refused with the series limit and only the first one's 80 series stored."""
    store = Storage.open(engine)
    heard = Heard()
    store.writer.subscribe(heard)
    batches = [_scrape("n1", T0, range(8)), _scrape("n1", T0 + 1, range(4, 12))]
    start = threading.Barrier(2)

    def ingest(batch: Batch) -> IngestResult | SeriesLimitExceeded:
        start.wait()
        try:
            return store.writer.ingest(batch, T0, limit)
        except SeriesLimitExceeded as exc:
            return exc

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(ingest, batches))
    table = _series(engine)
    stored = [o for o in outcomes if isinstance(o, IngestResult)]
    announced = [row[0] for b in heard.batches for row in b.series]
    assert sorted(announced) == sorted(table.values())  # each series announced once
    if limit == 1000:
        assert len(table) == 120 and sum(o.new_series for o in stored) == 120 and len(stored) == 2
        assert len(raw_points(engine)) == 160
    else:
        [refused] = [o for o in outcomes if isinstance(o, SeriesLimitExceeded)]
        assert (refused.limit, refused.existing, refused.new) == (100, 80, 40)
        assert len(table) == 80 and [o.new_series for o in stored] == [80]
        assert len(raw_points(engine)) == 80


def test_a_batch_refused_after_its_series_were_stored_finds_them_on_its_retry(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group fails after n1's series went in (the database refused the batch's points): the
    batch is refused, its series stay; its retry, and a restarted service's, store the points on
    those ids and create none, and a reader resolves the series it never heard of."""
    store = Storage.open(engine)
    batch = _scrape("n1", T0)
    original = GroupCommitWriter._write_batch

    def fail_once(self: GroupCommitWriter, cur: Any, job: Any, grown: Any) -> Any:
        monkeypatch.setattr(GroupCommitWriter, "_write_batch", original)
        raise RuntimeError("the database refused the batch")

    monkeypatch.setattr(GroupCommitWriter, "_write_batch", fail_once)
    with pytest.raises(RuntimeError, match="refused the batch"):
        store.writer.ingest(batch, T0, 1000)
    table = _series(engine)
    assert len(table) == 80 and raw_points(engine) == []
    assert store.writer.ingest(batch, T0, 1000).new_series == 0
    restarted = Storage.open(engine)  # no series cached: the node's batch reads them ahead
    assert restarted.writer.ingest(_scrape("n1", T0 + 10), T0 + 10, 1000).new_series == 0
    assert _series(engine) == table
    expected = [table[("n1", f"mlx5_{d}", f"c{c:02d}")] for d in range(8) for c in range(10)]
    assert [sid for _, sid, *_ in raw_points(engine)] == expected * 2
    deliveries, _ = restarted.stream.read(0)
    counters = [(s.reading.device, s.reading.counter) for d in deliveries for s in d.samples]
    assert counters == [(f"mlx5_{d}", f"c{c:02d}") for d in range(8) for c in range(10)] * 2
