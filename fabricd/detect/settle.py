"""Event-time settlement: hand the engine a moment of event time only once every live node has
delivered its data for it (docs/detection.md, "Settlement").

Agents scrape at their own phase within the interval and their batches arrive seconds apart, so
"what has arrived so far" is never one consistent moment of the fabric. The settler keeps, per
node, a *watermark* in the sense of Flink/Beam: the event time up to which the node's data is
complete. A node that delivered a whole scrape at ``ts`` and scrapes every ``period`` seconds will
not produce another sample before ``ts + period``, so its watermark is ``ts + period × (1 - slack)``
(``slack`` absorbs the schedule's own jitter). The *settled time* is the minimum watermark over the
live nodes; the samples at or before it form the next moment, evaluated exactly once.

A node whose watermark is older than the processing time minus ``lateness_seconds`` is *left out*:
settlement goes on without it (the node is reported, since a node going silent during a fault is
evidence too). What it delivers later for a moment already settled is *late*: counted and folded
into the next moment, never dropped and never a second evaluation of a settled moment.

Processing time is the central's wall clock live and the simulated arrival time in a replay; the
two are compared with the agents' event time, so agent clocks must be synchronized (NTP, as
Prometheus rule evaluation assumes for its timestamps). Pure: no clock of its own.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from fabricd.model import Sample
from fabricd.scrape_rows import ScrapeRows

INF = float("inf")
DEFAULT_PERIOD_SECONDS = 10.0  # the agent's default scrape interval, until a node's own is learned


@dataclass(frozen=True, slots=True)
class SettleParams:
    # at most one moment per this much event time (bounds evaluation cost); None: a fifth of the
    # shortest scrape interval, at least 1 s (an evaluation waits at most that for its moment)
    step_seconds: float | None = None
    lateness_seconds: float | None = None  # None: 0.5 x the node's period + 5 s (a batch may wait 5 s)
    slack: float = 0.2  # fraction of a period a scrape may come early
    default_period_seconds: float = DEFAULT_PERIOD_SECONDS

    def step(self, shortest_period: float) -> float:
        return self.step_seconds if self.step_seconds is not None else max(1.0, shortest_period / 5)

    def lateness(self, period: float) -> float:
        return self.lateness_seconds if self.lateness_seconds is not None else 0.5 * period + 5.0


@dataclass(slots=True)
class NodeMark:
    """What the settler knows of one node's delivery."""

    period: float
    last_ts: float = float("-inf")  # the newest scrape delivered (possibly still arriving)
    done_ts: float = float("-inf")  # the newest scrape known whole
    before_last: float = float("-inf")  # the scrape delivered before ``last_ts``
    heard: float = float("-inf")  # processing time of the last delivery
    learned: bool = False  # ``period`` measured from the node's own scrapes

    def watermark(self, slack: float) -> float:
        # until its interval is known, a node vouches only for what it delivered
        return self.done_ts + (self.period * (1.0 - slack) if self.learned else 0.0)


# One node's samples of one scrape (one event time), as a node delivered them: the unit the settler
# holds and hands on, so that a sample costs no (node, sample) pair of its own (docs/storage.md).
Scrape = tuple[str, Sequence[Sample]]  # a list, or the stored rows of one scrape (``ScrapeRows``)


@dataclass(frozen=True, slots=True)
class Moment:
    """One settled moment: every sample up to ``ts`` from every node not in ``left_out``, as the
    nodes' scrapes in event-time order."""

    ts: float
    scrapes: list[Scrape]
    left_out: tuple[str, ...]
    late: int  # samples in this moment that arrived after their own moment was settled

    @property
    def samples(self) -> list[tuple[str, Sample]]:
        """Every sample with its node, in order (a consumer that wants them one by one)."""
        return [(node, s) for node, samples in self.scrapes for s in samples]


@dataclass(frozen=True, slots=True)
class SettlementState:
    settled_ts: float | None
    lateness_seconds: float  # the allowed lateness of the slowest-scraping node
    nodes: int
    left_out: tuple[str, ...]
    late_samples: int
    max_node_lateness_seconds: float  # processing time minus the oldest live node's watermark


@dataclass
class Settler:
    params: SettleParams = field(default_factory=SettleParams)
    marks: dict[str, NodeMark] = field(default_factory=dict)
    settled_ts: float = float("-inf")
    late_samples: int = 0
    # held scrapes, as (ts, arrival order, node, samples): a heap, released in event-time order
    _pending: list[tuple[float, int, str, Sequence[Sample]]] = field(default_factory=list)
    _seq: int = 0
    _late_pending: int = 0
    _left_out: tuple[str, ...] = ()
    _now: float = float("-inf")
    _changed: bool = True  # a delivery or an expectation since the last full computation
    _dirty: set[str] = field(default_factory=set)  # nodes whose watermark may have moved
    _wm: dict[str, float] = field(default_factory=dict)  # node -> watermark
    _deadline: dict[str, float] = field(default_factory=dict)  # node -> left out after this time
    _recheck_at: float = float("-inf")  # processing time a live node would next be left out
    _partial: frozenset[str] = frozenset()  # nodes whose newest scrape was still arriving at the last tick

    def expect(self, nodes: Iterable[str], now: float) -> None:
        """Nodes known before any delivery (a restart): wait for them as for the others."""
        for node in nodes:
            if node not in self.marks:
                self.marks[node] = NodeMark(self.params.default_period_seconds, heard=now)
                self._changed = True
                self._dirty.add(node)

    def offer(self, node: str, samples: Sequence[Sample], now: float, stamps: Sequence[float] | None = None) -> None:
        """A delivery of ``node`` arrived at processing time ``now``. ``stamps`` are the event times
        of the scrapes it covers, in order, when they are more than the samples' own (a reader that
        left out the samples it does not use: ``fabricd.server.store.records.Delivery``)."""
        if stamps is None:
            stamps = stamps_of(samples)
        if not stamps:
            return
        mark = self.marks.get(node)
        if mark is None:
            mark = self.marks[node] = NodeMark(self.params.default_period_seconds)
        mark.heard = max(mark.heard, now)
        self._changed = True
        self._dirty.add(node)
        for ts in stamps:
            if ts > mark.last_ts:
                if mark.last_ts > float("-inf"):
                    _learn_period(mark, ts - mark.last_ts)
                mark.before_last = max(mark.last_ts, mark.done_ts)
                mark.last_ts = ts
        if not samples:
            return
        if len(stamps) == 1:  # one scrape (the usual delivery): held whole, no pass over its samples
            if stamps[0] <= self.settled_ts:
                self._late_pending += len(samples)
            self._hold(stamps[0], node, samples if isinstance(samples, (list, ScrapeRows)) else list(samples))
        else:
            self._hold_scrapes(node, samples)

    def _hold_scrapes(self, node: str, samples: Sequence[Sample]) -> None:
        settled = self.settled_ts
        chunk: list[Sample] = []
        chunk_ts = samples[0].ts
        for s in samples:
            ts = s.ts
            if ts != chunk_ts:
                self._hold(chunk_ts, node, chunk)
                chunk, chunk_ts = [], ts
            chunk.append(s)
            if ts <= settled:
                self._late_pending += 1
        self._hold(chunk_ts, node, chunk)

    def _hold(self, ts: float, node: str, samples: Sequence[Sample]) -> None:
        self._seq += 1
        heapq.heappush(self._pending, (ts, self._seq, node, samples))

    def tick(self, now: float, partial: Collection[str] = ()) -> list[Moment]:
        """Settle what can be settled at processing time ``now``. ``partial`` names the nodes whose
        newest delivery may have been offered in part (a reader that stopped inside it, at its
        limit of points): of those only the scrapes before the newest count as complete; every
        other node's newest scrape is whole."""
        self._now = now
        partial = frozenset(partial)
        if not self._changed and partial == self._partial and now <= self._recheck_at:
            return []  # no delivery and no node past its lateness since: nothing can have moved
        # which scrape counts as whole changed for the nodes that became partial or whole again
        self._dirty.update(n for n in partial ^ self._partial if n in self.marks)
        self._changed, self._partial = False, partial
        for node in self._dirty:
            self._update(node, node not in partial)
        self._dirty.clear()
        first_deadline = min(self._deadline.values(), default=float("inf"))
        if not self._wm:
            return []
        if first_deadline >= now:  # the usual case: nobody left out
            self._recheck_at = first_deadline
            self._left_out = ()
            target = min(self._wm.values())
        else:
            live = [wm for n, wm in self._wm.items() if now <= self._deadline[n]]
            left = sorted(n for n in self._wm if now > self._deadline[n])
            self._recheck_at = min(
                (self._deadline[n] for n in self._wm if now <= self._deadline[n]), default=float("inf")
            )
            self._left_out = tuple(left)
            target = min(live) if live else max(self._wm[n] for n in left)
        step = self._step()
        if target == float("-inf") or target < self.settled_ts + step:
            return []
        return self._release(target)

    def _step(self) -> float:
        periods = [m.period for m in self.marks.values() if m.learned]
        return self.params.step(min(periods) if periods else self.params.default_period_seconds)

    def _update(self, node: str, whole: bool) -> None:
        mark = self.marks[node]
        mark.done_ts = max(mark.done_ts, mark.last_ts if whole else mark.before_last)
        slack = self.params.slack
        self._wm[node] = mark.watermark(slack)
        # silent past the lateness: counted from where its next scrape was due (the default
        # interval until its own is known), or from when it was expected if never heard from
        due = mark.done_ts + mark.period * (1.0 - slack)
        start = due if mark.done_ts > float("-inf") else mark.heard
        self._deadline[node] = start + self.params.lateness(mark.period)

    def drain(self) -> list[Moment]:
        """Everything still held (the end of a replay, a clean shutdown)."""
        if not self._pending:
            return []
        return self._release(max(p[0] for p in self._pending))

    def state(self) -> SettlementState:
        periods = [m.period for m in self.marks.values()] or [self.params.default_period_seconds]
        left = set(self._left_out)
        # nodes not heard from yet have no watermark (-inf): they count once they deliver
        live = [w for n, m in self.marks.items() if n not in left and (w := m.watermark(self.params.slack)) > -INF]
        return SettlementState(
            settled_ts=self.settled_ts if self.settled_ts > float("-inf") else None,
            lateness_seconds=self.params.lateness(max(periods)),
            nodes=len(self.marks),
            left_out=self._left_out,
            late_samples=self.late_samples,
            max_node_lateness_seconds=max(0.0, self._now - min(live)) if live and self._now > float("-inf") else 0.0,
        )

    def _release(self, target: float) -> list[Moment]:
        """The moments up to ``target``: one per ``step_seconds`` of event time that holds samples
        (a backlog replays as the scrapes happened, not as one lump), the last one at ``target``."""
        ready: list[tuple[float, Scrape]] = []
        while self._pending and self._pending[0][0] <= target:
            ts, _, node, samples = heapq.heappop(self._pending)
            ready.append((ts, (node, samples)))
        late, self._late_pending = self._late_pending, 0
        self.late_samples += late
        step = self._step()
        moments: list[Moment] = []
        start = 0
        while start < len(ready):
            # the first moment also takes the late samples (older than what was settled)
            end_ts = max(ready[start][0], self.settled_ts) + step
            if end_ts + step > target:  # the last moment, at ``target``, is a whole step later
                break
            end = start
            while end < len(ready) and ready[end][0] < end_ts:
                end += 1
            moments.append(Moment(end_ts, _scrapes(ready[start:end]), self._left_out, late if not moments else 0))
            self.settled_ts = end_ts
            start = end
        moments.append(Moment(target, _scrapes(ready[start:]), self._left_out, late if not moments else 0))
        self.settled_ts = max(self.settled_ts, target)
        return moments


def _scrapes(ready: list[tuple[float, Scrape]]) -> list[Scrape]:
    return [scrape for _, scrape in ready]


def _learn_period(mark: NodeMark, gap: float) -> None:
    """Follow the node's scrape interval (smoothed); a gap after silence is not a period."""
    if not mark.learned:
        mark.period, mark.learned = gap, True
    elif gap < 0.6 * mark.period:  # the interval was shortened (or the first gap spanned silence)
        mark.period = gap
    elif gap < 1.5 * mark.period:
        mark.period = 0.8 * mark.period + 0.2 * gap


def stamps_of(samples: Sequence[Sample]) -> list[float]:
    """The samples' event times, each run of equal ones once, in order."""
    out: list[float] = []
    for s in samples:
        if not out or s.ts != out[-1]:
            out.append(s.ts)
    return out
