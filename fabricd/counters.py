"""Counter semantics shared by every collector: readings in, samples with honest rates out.

The maths, the rules and their blind spots are in ``docs/counters.md``. In short, per series
(``Reading.key()``) between two scrapes at ``t0`` and ``t1``:

* rate = (v1 - v0) / (t1 - t0) in the reading's unit per second (``value`` is already scaled);
* a narrower-than-64-bit counter that does not saturate and goes backwards **wrapped**: the delta
  is ``v1 + 2^width*scale - v0`` (status WRAPPED) unless its (source, device, port) group shows a
  reset;
* a saturating counter at all ones (``2^width - 1`` raw) is SATURATED: the value is unknown since
  then, so no rate (``since`` = first time seen saturated), never a fake spike or zero;
* a counter that cannot wrap going backwards (64-bit, or saturating), or two counters of one group
  going backwards in the same interval, is a RESET (driver reload, counters cleared): no rate for
  the group this interval, the baseline restarts;
* a rate above ``max_rate`` for its unit cannot be real (a misread wrap, a re-created counter):
  RESET as well. No negative and no giant rate ever leaves this stage;
* first sighting: FIRST, no rate. A series missing from an update is forgotten, so a device that
  re-appears starts FIRST again.

Call ``update`` once per scrape with every reading of that scrape (or keep one engine per
collector): series absent from the call are forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fabricd.model import Kind, Reading, Sample, Status

# Plausibility bounds, per second, by unit. Generous on purpose: they only have to reject the
# impossible. 1e12 bytes/s is 8 Tb/s, ten times an 800 Gb/s (XDR) port; 2e10 packets/s is over
# ten times what 800 Gb/s can carry at 64-byte packets.
DEFAULT_MAX_RATES: dict[str, float] = {"bytes": 1e12, "packets": 2e10, "ticks": 1e10, "seconds": 1.5}
DEFAULT_MAX_RATE = 1e10  # other units: errors, events, requests per second

SeriesKey = tuple[str, str, str, str, tuple[tuple[str, str], ...]]
GroupKey = tuple[str, str, str]


@dataclass(slots=True)
class _Series:
    ts: float
    raw: float  # value / scale: the hardware's own number, to which ``width`` applies
    saturated_since: float | None = None


def raw_of(r: Reading) -> float:
    return r.value / r.scale if r.scale else r.value


_ALL_ONES = [float((1 << w) - 1) for w in range(65)]


def all_ones(width: int) -> float:
    """2^width - 1: where a saturating counter of ``width`` bits clamps."""
    return _ALL_ONES[width]


def can_wrap(r: Reading) -> bool:
    """Only fixed-width, non-saturating counters narrower than 64 bits wrap (mlx5 32-bit Q counters)."""
    return 0 < r.width < 64 and not r.saturates


def is_saturated(r: Reading, raw: float) -> bool:
    return r.saturates and 0 < r.width <= 64 and raw >= _ALL_ONES[r.width]


def group_of(r: Reading) -> GroupKey:
    return (r.source, r.device, r.port)


# One counter reading of this scrape with its series' state from the previous one:
# (reading, series key, raw hardware value, previous state). A tuple: this is the hot path.
_Seen = tuple[Reading, "SeriesKey", float, "_Series | None"]


class RateEngine:
    """Per-node counter state; ``update`` turns one scrape's readings into samples."""

    def __init__(
        self, max_rates: Mapping[str, float] | None = None, default_max_rate: float = DEFAULT_MAX_RATE
    ) -> None:
        self.max_rates = dict(DEFAULT_MAX_RATES if max_rates is None else max_rates)
        self.default_max_rate = default_max_rate
        self._state: dict[SeriesKey, _Series] = {}

    @property
    def tracked_series(self) -> int:
        """How many counter series have a baseline (vanished ones are forgotten)."""
        return len(self._state)

    def update(self, ts: float, readings: Sequence[Reading]) -> list[Sample]:
        # The hot path of every scrape (hundreds of counters per node): one pass to look up state
        # and spot groups that went backwards, one to compute rates, no per-counter objects.
        seen = self._lookup(readings)
        reset_groups = reset_groups_of(seen)
        state: dict[SeriesKey, _Series] = {}
        out: list[Sample] = []
        counter = self._counter
        counters = iter(seen)
        for r in readings:
            if r.kind is not Kind.COUNTER:
                out.append(Sample(ts, r))
                continue
            c = next(counters)
            sample, state[c[1]] = counter(ts, c, bool(reset_groups) and group_of(r) in reset_groups)
            out.append(sample)
        self._state = state  # series missing from this scrape are forgotten
        return out

    def _lookup(self, readings: Sequence[Reading]) -> list[_Seen]:
        get = self._state.get
        counter_kind = Kind.COUNTER
        return [
            (r, key, r.value / r.scale if r.scale != 1.0 and r.scale else r.value, get(key))
            for r in readings
            if r.kind is counter_kind
            for key in ((r.source, r.device, r.port, r.counter, r.labels),)
        ]

    def _counter(self, ts: float, c: _Seen, group_reset: bool) -> tuple[Sample, _Series]:
        r, _key, raw, prev = c
        if r.saturates and is_saturated(r, raw):
            since = prev.saturated_since if prev is not None and prev.saturated_since is not None else ts
            return Sample(ts, r, None, Status.SATURATED, since), _Series(ts, raw, since)
        if prev is None or ts <= prev.ts:  # first sighting, or a clock that stepped back: new baseline
            return Sample(ts, r, None, Status.FIRST), _Series(ts, raw)
        delta, dt = raw - prev.raw, ts - prev.ts
        prev.ts, prev.raw, prev.saturated_since = ts, raw, None  # the new baseline, updated in place
        if group_reset:
            return Sample(ts, r, None, Status.RESET), prev
        status = Status.OK
        if delta < 0:  # only wrapping counters get here; the others made the group reset
            delta, status = delta + 2.0**r.width, Status.WRAPPED
        rate = delta * r.scale / dt
        if rate > self.max_rates.get(r.unit, self.default_max_rate):
            return Sample(ts, r, None, Status.RESET), prev
        return Sample(ts, r, rate, status), prev


def reset_groups_of(seen: Sequence[_Seen]) -> set[GroupKey]:
    """Groups where a counter that cannot wrap went backwards, or two counters did."""
    backwards: dict[GroupKey, int] = {}
    definite: set[GroupKey] = set()
    for r, _key, raw, prev in seen:
        if prev is None or raw >= prev.raw:
            continue
        group = group_of(r)
        backwards[group] = backwards.get(group, 0) + 1
        if not can_wrap(r):
            definite.add(group)
    return definite | {g for g, n in backwards.items() if n > 1}
