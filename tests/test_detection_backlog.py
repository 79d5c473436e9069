"""A backlog read back by the detection loop settles as the scrapes arrived, not at the wall clock.

After a restart (or in a central that fell behind) the loop reads points stored long before its
clock. With the wall clock as processing time, every node whose next scrape the read had not
reached was past its lateness, so moments settled with most of the fleet left out
(``fabricd/server/read_timing.py``). These tests read a stored run back in small chunks, the clock
just after the run's end, through the real store and settlement.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricd.detect.engine import DetectionEngine
from fabricd.detect.settle import Scrape
from fabricd.model import Incident
from fabricd.server.detection import DetectionLoop, EngineFeed
from fabricd.server.metrics import ServerMetrics
from fabricd.server.read_timing import ReadTiming
from fabricd.server.store.records import Delivery
from fabricd.server.store.storage import Storage
from tests.support.server import ib_sample, make_batch, sqlite_storage

T0 = 1_800_000_000.0
PERIOD = 10.0
NODES = [f"n{i}" for i in range(6)]
DEAD = "n5"  # stops after its 4th scrape
SCRAPES = 12
PORTS = 4  # points per batch: a read of 10 points cuts batches


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Storage]:
    with sqlite_storage(tmp_path / "fabricd.db") as storage:
        yield storage


class Recorder(DetectionEngine):
    """The real engine, noting which nodes each settled moment left out."""

    def __init__(self) -> None:
        super().__init__()
        self.left_out: list[tuple[float, tuple[str, ...]]] = []
        self.points = 0

    def process_scrapes(self, scrapes: Sequence[Scrape], ts: float, left_out: Sequence[str] = ()) -> list[Incident]:
        self.left_out.append((ts, tuple(left_out)))
        self.points += sum(len(samples) for _, samples in scrapes)
        return super().process_scrapes(scrapes, ts, left_out)


def _run() -> list[tuple[float, str, float]]:
    """(event time, node, arrival) of each scrape: six nodes every 10 s at their own phase
    (0-2.5 s), stored a second later; one falls silent after its 4th scrape."""
    return [
        (T0 + k * PERIOD + 0.5 * i, node, T0 + k * PERIOD + 0.5 * i + 1.0)
        for k in range(SCRAPES)
        for i, node in enumerate(NODES)
        if not (node == DEAD and k >= 4)
    ]


def _store(store: Storage, ts: float, node: str, arrival: float) -> None:
    samples = [ib_sample(ts, device=f"mlx5_{p}") for p in range(PORTS)]
    store.writer.ingest(make_batch(node, f"{node}-{ts}", samples, ts), arrival, 100)


def _loop(store: Storage, engine: Recorder, clock: list[float], chunk: int) -> DetectionLoop:
    return DetectionLoop(
        store.stream,
        store.incidents,
        EngineFeed(engine),
        ServerMetrics(CollectorRegistry()),
        clock=lambda: clock[0],
        chunk=chunk,
        nodes=NODES,
    )


def _read_back(store: Storage, chunk: int) -> Recorder:
    """The whole run stored, then read by a loop started just after its end (a restart)."""
    for scrape in _run():
        _store(store, *scrape)
    engine = Recorder()
    loop = _loop(store, engine, [T0 + (SCRAPES - 1) * PERIOD + 3.0], chunk)
    while loop.step():
        pass
    return engine


def _live(store: Storage) -> Recorder:
    """The same run, each scrape read as it is stored, at its arrival time."""
    engine, clock = Recorder(), [T0]
    loop = _loop(store, engine, clock, 20_000)
    for ts, node, arrival in _run():
        _store(store, ts, node, arrival)
        clock[0] = arrival
        while loop.step():
            pass
    return engine


def _first_left_out(engine: Recorder) -> float:
    return min(ts for ts, left in engine.left_out if left)


def test_a_backlog_read_in_chunks_leaves_out_only_the_node_that_fell_silent(store: Storage) -> None:
    engine = _read_back(store, chunk=10)
    assert engine.points == PORTS * len(_run())  # every stored point, once
    silent_since = T0 + 3 * PERIOD + 0.5 * NODES.index(DEAD)  # its last scrape
    assert {left for _, left in engine.left_out} == {(), (DEAD,)}
    assert all(left == () for ts, left in engine.left_out if ts < silent_since + PERIOD)
    # Its lateness: 0.8 x its period until its next scrape was due, then 0.5 x period + 5 s.
    assert all(left == (DEAD,) for ts, left in engine.left_out if ts > silent_since + 2.3 * PERIOD)


def test_a_backlog_leaves_the_silent_node_out_where_live_delivery_did(tmp_path: Path) -> None:
    """The same run read live, scrape by scrape at its arrival, and as a backlog in chunks after a
    restart: the silent node is left out from the same moment on, and no other node ever is."""
    with sqlite_storage(tmp_path / "live.db") as first, sqlite_storage(tmp_path / "backlog.db") as second:
        live, backlog = _live(first), _read_back(second, chunk=10)
    assert live.points == backlog.points == PORTS * len(_run())
    for engine in (live, backlog):
        assert {left for _, left in engine.left_out} == {(), (DEAD,)}
    # Moments fall at other event times (a read settles up to its own frontier), hence a step's leeway.
    assert abs(_first_left_out(live) - _first_left_out(backlog)) <= PERIOD / 5


def _delivery(node: str, ts: float, points: int) -> Delivery:
    return Delivery(node, [], points, [ts])


def test_a_read_at_its_limit_stands_for_the_newest_event_time_read_not_the_wall_clock() -> None:
    timing = ReadTiming(limit=10)
    wall = T0 + 3600.0
    now, partial = timing.timing([_delivery("a", T0, 4), _delivery("b", T0 + 1, 4), _delivery("a", T0 + 10, 2)], wall)
    assert (now, partial) == (T0 + 10, frozenset({"a"}))  # only the read's last delivery may be cut
    # An old spooled scrape read later does not take the time back.
    assert timing.timing([_delivery("c", T0 - 300, 10)], wall) == (T0 + 10, frozenset({"c"}))
    # A read short of its limit reached the end of the stream: the wall clock, nothing cut.
    assert timing.timing([_delivery("a", T0 + 20, 3)], wall) == (wall, frozenset())
    # Points read after that were stored after it: the time never goes back before that read.
    assert timing.timing([_delivery("b", T0 + 30, 10)], wall + 5) == (wall, frozenset({"b"}))


def test_streams_read_together_stand_for_the_one_furthest_behind() -> None:
    """A correlator reads every partition up to the limit each: a dense partition's frontier lags a
    sparse one's, and the read stands for the older frontier of those still behind."""
    timing = ReadTiming(limit=10, stream_of=lambda node: 0 if node.startswith("dense") else 1)
    wall = T0 + 3600.0
    read = [_delivery("dense-1", T0, 5), _delivery("dense-2", T0 + 1, 5), _delivery("sparse-1", T0 + 90, 10)]
    assert timing.timing(read, wall) == (T0 + 1, frozenset({"dense-2", "sparse-1"}))
    read = [_delivery("dense-1", T0 + 10, 5), _delivery("sparse-1", T0 + 190, 2)]  # sparse reached its end
    assert timing.timing(read, wall) == (wall, frozenset())
