"""Event-time settlement (issue 15): 8 nodes with scrape phases spread over the interval, one node
3 intervals late, one node silent. The engine sees each moment exactly once: complete, or with the
silent node left out after its lateness, never half a moment."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from fabricd.detect.settle import Moment, SettleParams, Settler
from fabricd.model import Kind, Reading, Sample

PERIOD = 10.0
NODES = [f"n{i}" for i in range(8)]
LATE, SILENT = "n6", "n7"
SILENT_FROM = 40.0
END = 200.0


def _scrape(node: str, ts: float) -> list[Sample]:
    del node
    return [Sample(ts, Reading("infiniband", d, "1", "port_xmit_data", 1.0, "bytes", Kind.COUNTER)) for d in ("a", "b")]


@dataclass
class Run:
    moments: list[Moment]
    produced: list[float]  # processing time each moment was settled at
    offered: list[tuple[str, float, float]]  # node, event ts, arrival
    settler: Settler


def _run(params: SettleParams, delivery_delay: float = 0.7) -> Run:
    settler = Settler(params)
    settler.expect(NODES, 0.0)  # the central knows its fleet (a restart: the nodes it heard from)
    arrivals: list[tuple[float, str, float]] = []  # arrival, node, ts
    for i, node in enumerate(NODES):
        phase = i * PERIOD / len(NODES)
        k = 0
        while (ts := phase + k * PERIOD) < END:
            k += 1
            if node == SILENT and ts >= SILENT_FROM:
                continue
            delay = 3 * PERIOD if node == LATE else delivery_delay
            arrivals.append((ts + delay, node, ts))
    arrivals.sort()
    moments: list[Moment] = []
    produced: list[float] = []
    now, j = 0.0, 0
    while now <= END + 4 * PERIOD:
        while j < len(arrivals) and arrivals[j][0] <= now:
            _, node, ts = arrivals[j]
            settler.offer(node, _scrape(node, ts), now)
            j += 1
        ready = settler.tick(now)
        moments.extend(ready)
        produced.extend(now for _ in ready)
        now += 0.25
    return Run(moments, produced, [(n, ts, a) for a, n, ts in arrivals], settler)


def _released_at(run: Run) -> dict[tuple[str, float], list[int]]:
    out: dict[tuple[str, float], list[int]] = {}
    for m, moment in enumerate(run.moments):
        for node, s in moment.samples:
            out.setdefault((node, s.ts), []).append(m)
    return out


def _check_each_moment_once_and_whole(run: Run) -> None:
    released = _released_at(run)
    # every scrape released, each exactly once and whole (both of its samples in one moment)
    assert {(n, ts) for n, ts, _ in run.offered if ts <= run.moments[-1].ts} == set(released)
    assert all(len(ms) == 2 and ms[0] == ms[1] for ms in released.values())
    stamps = [m.ts for m in run.moments]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)  # each moment once
    assert all(b - a >= 1.0 - 1e-9 for a, b in itertools.pairwise(stamps))  # step_seconds
    # never half a moment: a node not left out has delivered everything up to the moment's time
    for m, moment in enumerate(run.moments):
        for (node, ts), (first, _) in released.items():
            if ts <= moment.ts and first > m:
                assert node in moment.left_out, f"{node}@{ts} missing from moment {moment.ts} without being left out"


def test_with_the_default_lateness_the_late_node_is_left_out_and_its_samples_folded_in() -> None:
    run = _run(SettleParams())
    _check_each_moment_once_and_whole(run)
    released = _released_at(run)
    arrival = {(n, ts): a for n, ts, a in run.offered}
    # the late node's scrapes are late (their moment settled without it), folded into the first
    # moment settled after they arrived
    late = [(n, ts) for (n, ts) in released if n == LATE]
    first_after = {k: next(m for m, at in enumerate(run.produced) if at >= arrival[k]) for k in late}
    assert late and all(released[k][0] == first_after[k] for k in late)
    assert all(ts <= run.moments[first_after[(n, ts)] - 1].ts for n, ts in late)  # late indeed
    assert run.settler.late_samples == 2 * len(late)
    assert sum(m.late for m in run.moments) == run.settler.late_samples
    # left out: the late node throughout, the silent one once its lateness has passed
    lateness = SettleParams().lateness(PERIOD)
    last_silent = max(ts for n, ts, _ in run.offered if n == SILENT)
    watermark = last_silent + PERIOD * (1 - SettleParams().slack)
    for moment in run.moments[3:]:
        assert LATE in moment.left_out
        if moment.ts < END - PERIOD:  # (after END every node falls silent)
            assert (SILENT in moment.left_out) == (moment.ts > watermark), moment
    steady = [m for m in run.moments if watermark + lateness < m.ts < END - PERIOD]
    assert steady and all(m.left_out == (LATE, SILENT) for m in steady)
    # settlement went on without them: the settled time follows the live nodes, not the silent one
    assert run.moments[-1].ts > END - PERIOD
    assert watermark + lateness < END


def test_a_lateness_longer_than_the_delay_waits_for_the_late_node_and_nothing_is_late() -> None:
    run = _run(SettleParams(lateness_seconds=4 * PERIOD))
    _check_each_moment_once_and_whole(run)
    assert run.settler.late_samples == 0
    assert all(LATE not in m.left_out for m in run.moments)
    # the silent node is left out only once the processing time passed its watermark + 4 intervals
    last_silent = max(ts for n, ts, _ in run.offered if n == SILENT)
    deadline = last_silent + PERIOD * (1 - SettleParams().slack) + 4 * PERIOD
    for moment, at in zip(run.moments, run.produced, strict=True):
        assert (SILENT in moment.left_out) == (at > deadline)


def test_a_backlog_is_replayed_as_it_happened_not_as_one_lump() -> None:
    settler = Settler()
    for k in range(30):
        for i, node in enumerate(NODES):
            settler.offer(node, _scrape(node, k * PERIOD + i), now=0.0)
    moments = settler.tick(now=30 * PERIOD)
    assert len(moments) >= 30 * len(NODES) // 2
    assert sum(len(m.samples) for m in moments) == 30 * len(NODES) * 2


def test_a_scrape_still_arriving_is_not_settled_until_it_is_whole() -> None:
    settler = Settler()
    for k in range(3):
        settler.offer("a", _scrape("a", k * PERIOD), now=k * PERIOD)
    settler.offer("a", _scrape("a", 3 * PERIOD)[:1], now=3 * PERIOD)  # half of a scrape read so far
    released = [s for m in settler.tick(3 * PERIOD, partial={"a"}) for _, s in m.samples]
    assert max(s.ts for s in released) == 2 * PERIOD
    settler.offer("a", _scrape("a", 3 * PERIOD)[1:], now=3 * PERIOD)
    rest = [s for m in settler.tick(3 * PERIOD) for _, s in m.samples]
    assert [s.ts for s in rest] == [3 * PERIOD, 3 * PERIOD]


def test_only_the_node_a_read_may_have_cut_waits_for_its_newest_scrape() -> None:
    """A reader at its limit cuts at most its last delivery: the other nodes' newest scrapes are
    whole and count, so the moment waits only for the cut node's."""
    settler = Settler()
    for k in range(3):
        for node in ("a", "b"):
            settler.offer(node, _scrape(node, k * PERIOD), now=k * PERIOD)
    settler.offer("b", _scrape("b", 3 * PERIOD), now=3 * PERIOD)
    settler.offer("a", _scrape("a", 3 * PERIOD)[:1], now=3 * PERIOD)  # cut: the read's last delivery
    settler.tick(3 * PERIOD, partial={"a"})
    assert settler.marks["b"].done_ts == 3 * PERIOD and settler.marks["a"].done_ts == 2 * PERIOD
    settler.offer("a", _scrape("a", 3 * PERIOD)[1:], now=3 * PERIOD)
    settler.tick(3 * PERIOD, partial={"b"})  # now b's next delivery is the cut one; a is whole again
    assert settler.marks["a"].done_ts == 3 * PERIOD and settler.marks["b"].done_ts == 3 * PERIOD


@pytest.mark.parametrize("phase_spread", [0.0, 0.5, 0.999])
def test_the_learned_period_follows_the_scrape_interval(phase_spread: float) -> None:
    settler = Settler()
    for k in range(5):
        settler.offer("a", _scrape("a", k * 5.0 + phase_spread), now=k * 5.0)
    assert settler.marks["a"].period == pytest.approx(5.0)


def test_the_state_of_a_node_expected_but_not_heard_from_is_finite() -> None:
    """A restarted central expects its recent nodes before they deliver: /api/v1/status and
    /metrics must still show finite figures (JSON has no infinity)."""
    settler = Settler()
    settler.expect(["a", "b"], now=100.0)
    settler.offer("a", _scrape("a", 100.0), now=100.5)
    settler.tick(101.0)
    state = settler.state()
    assert state.settled_ts is None and state.nodes == 2 and state.left_out == ()
    assert state.max_node_lateness_seconds == 1.0  # a's watermark is its scrape (period not learned)


def test_a_scrape_whose_samples_the_reader_left_out_still_moves_the_node_on() -> None:
    """The detection loop reads only what the detectors use (``records.Keep``): a node whose scrape
    held nothing of it arrives as its event times alone, and settlement must neither wait for it
    nor leave it out (a node sending only ethtool statistics the rules do not read, say)."""

    def run(stamps: bool) -> tuple[list[Moment], Settler]:
        settler = Settler()
        settler.expect(["a", "b"], now=0.0)
        moments: list[Moment] = []
        for k in range(6):
            ts = 10.0 * k
            settler.offer("a", _scrape("a", ts), now=ts + 0.5)
            if stamps:
                settler.offer("b", [], now=ts + 0.5, stamps=[ts])
            moments += settler.tick(ts + 0.5)
        return moments, settler

    moments, settler = run(stamps=True)
    # each scrape of a released as soon as it arrived (b's times said b was done too), and no one
    # left out at any moment
    released = [sorted({s.ts for _, s in m.samples}) for m in moments if m.samples]
    assert released == [[0.0], [10.0], [20.0], [30.0], [40.0], [50.0]]
    assert all(m.left_out == () for m in moments) and settler.state().left_out == ()
    assert settler.marks["b"].period == pytest.approx(10.0)  # learned from the event times alone
    # Without its event times, b looks silent and is left out.
    moments, settler = run(stamps=False)
    assert all(m.left_out == ("b",) for m in moments) and settler.state().left_out == ("b",)


def test_the_replay_hands_on_only_what_the_engine_reads_with_every_scrape_time() -> None:
    """``fabricd eval`` offers what the simulated agents sent through ``Detection.offer_scrape``:
    the same choice as the central's stream read (``records.Keep``), so both run one path."""
    from fabricd.detect.engine import DetectionEngine
    from fabricd.detect.feed import Detection

    def sample(ts: float, counter: str, name: str) -> Sample:
        return Sample(ts, Reading("infiniband", "mlx5_0", "1", counter, 1.0, "bytes", Kind.COUNTER, (), name), 5.0)

    detection = Detection(DetectionEngine())
    detection.offer_scrape(
        "a", [sample(10.0, "port_xmit_data", "port_transmit_data"), sample(10.0, "vl15_dropped", "")], 10.5
    )
    detection.offer_scrape("b", [sample(10.0, "vl15_dropped", ""), sample(11.0, "vl15_dropped", "")], 11.5)
    held = sorted((node, s.reading.counter) for _ts, _seq, node, samples in detection.settler._pending for s in samples)
    assert held == [("a", "port_xmit_data")]
    assert detection.settler.marks["a"].last_ts == 10.0 and detection.settler.marks["b"].last_ts == 11.0


def test_a_moment_hands_each_scrape_as_one_group_and_counts_a_late_one_whole() -> None:
    """Moments carry the nodes' scrapes (node, its samples of one event time), in event-time order;
    a delivery of two scrapes is split into both; one whose moment already settled is late, every
    sample of it, and folded into the next moment."""
    settler = Settler(SettleParams(step_seconds=1.0))
    settler.expect(["a", "b"], 0.0)
    two = _scrape("a", 0.0) + _scrape("a", PERIOD)
    settler.offer("a", two, now=PERIOD)  # a spool replayed: two scrapes in one delivery
    settler.offer("b", _scrape("b", 2.0), now=PERIOD)
    settler.offer("b", _scrape("b", PERIOD + 2.0), now=PERIOD)
    moments = settler.tick(PERIOD + 2.0)
    scrapes = [(node, [s.ts for s in samples]) for m in moments for node, samples in m.scrapes]
    assert scrapes == [("a", [0.0, 0.0]), ("b", [2.0, 2.0]), ("a", [PERIOD, PERIOD]), ("b", [PERIOD + 2.0] * 2)]
    assert [(n, s.ts) for m in moments for n, s in m.samples] == [(n, t) for n, ts in scrapes for t in ts]
    assert settler.late_samples == 0
    settler.offer("b", _scrape("b", 5.0), now=PERIOD + 3.0)  # older than what settled: late, whole
    settler.offer("a", _scrape("a", 2 * PERIOD), now=2 * PERIOD + 3.0)
    settler.offer("b", _scrape("b", 2 * PERIOD + 2.0), now=2 * PERIOD + 3.0)
    later = settler.tick(2 * PERIOD + 3.0)
    assert settler.late_samples == 2 and sum(m.late for m in later) == 2
    assert ("b", [5.0, 5.0]) in [(node, [s.ts for s in samples]) for node, samples in later[0].scrapes]
