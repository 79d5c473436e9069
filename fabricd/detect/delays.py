"""Pair delays with the hosts' jitter taken out: the queueing a probe path adds, scored.

A pingmesh RTT is the path plus both hosts. On a loaded host the host part is the larger one: its
median moves by hundreds of microseconds between scrapes and a scheduling stall puts milliseconds
into the p99 (measured here, docs/detection.md "Measured jitter"), while a congested fabric queue
adds ~100-400 us. Two things make the fabric's part readable anyway:

* the *minimum* RTT of a scrape's probes: a stall catches a few probes, never all of them, so the
  minimum keeps the hosts' floor and moves little; a standing queue delays even the fastest probe;
* the *prober's common mode*: every pair a node probes shares that node's host (its load, its
  event loop). Per scrape, the least-delayed of its pairs (against each pair's own baseline)
  measures what the host added to all of them (below zero: the median path's, a host quieter
  than usual on every path; ``_host_share``); subtracting it leaves each path's own excess. A
  fault on one path leaves the prober's other paths as the reference; a prober whose every path
  crosses the fault loses that reference (its pairs look clean), and other probers' pairs carry it.
  The common mode subtracted is capped at the prober's own normal range (its history of common
  modes): host jitter stays within it, while a stall of the prober's own port (head-of-line
  pauses) or a queue on every path it probes adds far more, and that excess is left to be seen.

Scores: ``rtt_queue_outlier`` (minimum) and ``rtt_p99_outlier`` (p99, for tail latency), each
``(adjusted - median) / scale`` against the pair's robust history (``latency.Baselines``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median

from fabricd.detect.latency import MAD_TO_SIGMA, Baselines
from fabricd.model import Labels

Observe = Callable[[str, str, str, str, Labels, float, float], None]


@dataclass(slots=True)
class _Row:
    node: str
    peer: str
    labels: Labels
    ts: float
    rtt_min: float | None
    rtt_p99: float | None


COMMON_HISTORY = 30  # common modes per prober kept for its normal range
COMMON_SIGMAS = 4.0  # the normal range: median + this many robust sigmas
COMMON_MIN_HISTORY = 5  # a range from fewer would be noise; until then nothing is capped


class _Common:
    """A prober's recent common modes: how much host jitter it usually adds to all its pairs."""

    def __init__(self, floor: float) -> None:
        self.values: deque[float] = deque(maxlen=COMMON_HISTORY)
        self.floor = floor

    def cap(self, value: float) -> float:
        """``value`` limited to the normal range (no cap until there is a history)."""
        if len(self.values) < COMMON_MIN_HISTORY:
            self.values.append(value)
            return value
        med = median(self.values)
        top = med + COMMON_SIGMAS * max(MAD_TO_SIGMA * median(abs(v - med) for v in self.values), self.floor)
        if value <= top:
            self.values.append(value)
        return min(value, top)


class Delays:
    def __init__(self, queue: Baselines, tail: Baselines) -> None:
        self.queue, self.tail = queue, tail
        self._rows: dict[str, list[_Row]] = {}  # prober -> this evaluation's rows
        self._common: dict[tuple[str, str], _Common] = {}  # (prober, field) -> its common modes

    def add(
        self, node: str, peer: str, labels: Labels, ts: float, rtt_min: float | None, rtt_p99: float | None
    ) -> None:
        self._rows.setdefault(node, []).append(_Row(node, peer, labels, ts, rtt_min, rtt_p99))

    def flush(self, observe: Observe) -> None:
        """Score every row added since the last flush and hand the scores to ``observe``."""
        rows, self._rows = self._rows, {}
        for prober_rows in rows.values():
            for row_set in _by_scrape(prober_rows):
                self._score(row_set, "rtt_min", self.queue, "rtt_queue_outlier", observe)
                self._score(row_set, "rtt_p99", self.tail, "rtt_p99_outlier", observe)

    def _score(self, rows: list[_Row], field: str, baselines: Baselines, signal: str, observe: Observe) -> None:
        values = [(r, getattr(r, field)) for r in rows if getattr(r, field) is not None]
        excess = [v - med for r, v in values if (med := baselines.series_median((r.node, r.peer))) is not None]
        common = 0.0
        if len(excess) >= 2:
            key = (rows[0].node, field)
            history = self._common.get(key)
            if history is None:
                history = self._common[key] = _Common(baselines.p.abs_floor)
            common = history.cap(_host_share(excess))
        for r, v in values:
            adjusted = v - common
            own, _ = baselines.score((field,), (r.node, r.peer), r.ts, adjusted)
            ready = baselines.series_median((r.node, r.peer)) is not None
            observe(signal, r.node, r.peer, "", r.labels, r.ts, own if ready else 0.0)


def _host_share(excess: list[float]) -> float:
    """What the prober's host added to all its pairs this scrape (two pairs at least): what even its
    least-delayed path got on top of its normal.

    Below zero (a host quieter than usual): the median path's excess, and no lower than the second
    lowest. A shift common to every path moves the median path with it, whatever the noise of each:
    the live demo's node-002 had its four paths 204-225 us under their medians at once. The lowest
    paths alone are no such shift: one path faster than its normal is that path's own (the live demo:
    node-012's pair to node-013 fell 190 us below its median; taken as the common mode it lifted the
    three others to 7-14 robust sigmas, and with node-009's the same, a congestion opened on an idle
    uplink), and so are two among many when the rest are at their normal (the routed lab: of a
    prober's 11 paths, the ones with 70-240 us of noise sat 200-250 us under their medians as often
    as not while the rest sat within 30 us of theirs; the second lowest, subtracted from all, lifted
    the quiet paths to 15-20 robust sigmas every scrape, and a congestion opened on a healthy leaf
    beside the lab's fault, tests/test_leafspine_lab.py)."""
    low = sorted(excess)
    if low[0] >= 0:
        return low[0]
    return min(max(median(low), low[1]), 0.0)


def _by_scrape(rows: list[_Row]) -> list[list[_Row]]:
    """A prober's rows grouped by scrape (a moment may hold two scrapes of a node: a spool replay)."""
    groups: dict[float, list[_Row]] = {}
    for r in rows:
        groups.setdefault(r.ts, []).append(r)
    return [groups[ts] for ts in sorted(groups)]
