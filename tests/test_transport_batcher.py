"""Batches are bounded by size and by age, carry health, and get unique ids."""

from __future__ import annotations

from fabricd.clock import ManualClock
from fabricd.model import CollectorHealth
from fabricd.transport.batcher import Batcher
from tests.test_transport_central_double import scrape


def _batcher(max_samples: int = 10, max_seconds: float = 5.0) -> Batcher:
    return Batcher("n1", "0.1.0", max_samples, max_seconds, ManualClock().time)


def test_a_batch_holds_whole_scrapes_and_closes_before_one_would_overflow_it() -> None:
    """The central settles a node's event time by its last delivered scrape (fabricd.detect.settle):
    a batch closes before a scrape that would not fit, and only a scrape larger than a batch is cut."""
    b = _batcher(max_samples=10)
    out = b.add(scrape(1.0, ports=4), [], now=0.0) + b.add(scrape(2.0, ports=4), [], now=1.0)
    assert out == []
    out = b.add(scrape(3.0, ports=4), [], now=2.0)
    assert [[s.ts for s in x.samples] for x in out] == [[1.0] * 4 + [2.0] * 4]
    assert b.pending == 4
    rest = b.flush()
    assert rest is not None and [s.ts for s in rest.samples] == [3.0] * 4
    big = b.add(scrape(4.0, ports=12), [], now=3.0)
    assert [len(x.samples) for x in big] == [10] and b.pending == 2


def test_an_open_batch_becomes_due_after_max_seconds() -> None:
    b = _batcher(max_seconds=5.0)
    b.add(scrape(1.0), [], now=100.0)
    assert not b.due(104.9)
    assert b.due(105.0)
    assert b.deadline() == 105.0


def test_health_travels_with_the_batch_and_nothing_pending_means_no_batch() -> None:
    b = _batcher()
    assert b.flush() is None and b.deadline() is None
    health = CollectorHealth("infiniband", False, 0.2, 1.0, error="timed out")
    b.add([], [health], now=0.0)
    batch = b.flush()
    assert batch is not None and batch.health == [health] and batch.node == "n1"


def test_batch_ids_are_unique() -> None:
    b = _batcher(max_samples=1)
    batches = b.add(scrape(1.0, ports=50), [], now=0.0)
    assert len(batches) == 50
    assert len({x.batch_id for x in batches}) == 50
