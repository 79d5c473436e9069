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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fabricd.model import Kind, Reading, Sample, Status

# Plausibility bounds, per second, by unit. Generous on purpose: they only have to reject the
# impossible. 1e12 bytes/s is 8 Tb/s, ten times an 800 Gb/s (XDR) port; 2e10 packets/s is over
# ten times what 800 Gb/s can carry at 64-byte packets.
DEFAULT_MAX_RATES: dict[str, float] = {"bytes": 1e12, "packets": 2e10, "ticks": 1e10, "seconds": 1.5}
DEFAULT_MAX_RATE = 1e10  # other units: errors, events, requests per second

SeriesKey = tuple[str, str, str, str, tuple[tuple[str, str], ...]]
GroupKey = tuple[str, str, str]


# Per-series state between scrapes: (ts, raw, saturated_since), raw = value / scale (the hardware's own
# number, to which ``width`` applies). A tuple replaced every scrape, never mutated: cheaper than
# updating an object, and the previous scrape's state stays intact for ``_update_with_duplicates``.
_State = tuple[float, float, "float | None"]


@dataclass(slots=True)
class _Series:
    """Mutable per-series state of the two-pass algorithm (``_update_with_duplicates`` only)."""

    ts: float
    raw: float
    saturated_since: float | None = None


def raw_of(r: Reading) -> float:
    return r.value / r.scale if r.scale else r.value


_ALL_ONES = [float((1 << w) - 1) for w in range(65)]


def can_wrap(r: Reading) -> bool:
    """Only fixed-width, non-saturating counters narrower than 64 bits wrap (mlx5 32-bit Q counters)."""
    return 0 < r.width < 64 and not r.saturates


def is_saturated(r: Reading, raw: float) -> bool:
    return r.saturates and 0 < r.width <= 64 and raw >= _ALL_ONES[r.width]


def group_of(r: Reading) -> GroupKey:
    return (r.source, r.device, r.port)


# One counter reading with its series' state from the previous scrape, for the two-pass algorithm:
# (reading, series key, raw hardware value, previous state).
_Seen = tuple[Reading, "SeriesKey", float, "_Series | None"]


class RateEngine:
    """Per-node counter state; ``update`` turns one scrape's readings into samples."""

    def __init__(
        self, max_rates: Mapping[str, float] | None = None, default_max_rate: float = DEFAULT_MAX_RATE
    ) -> None:
        self.max_rates = dict(DEFAULT_MAX_RATES if max_rates is None else max_rates)
        self.default_max_rate = default_max_rate
        self._state: dict[SeriesKey, _State] = {}

    @property
    def tracked_series(self) -> int:
        """How many counter series have a baseline (vanished ones are forgotten)."""
        return len(self._state)

    def update(self, ts: float, readings: Sequence[Reading]) -> list[Sample]:
        out, state, backwards, others = self._one_pass(ts, readings)
        if len(state) + others != len(readings):
            return self._update_with_duplicates(ts, readings)  # two readings of one series
        if backwards:
            apply_resets(ts, out, reset_groups_of(backwards))
        self._state = state  # series missing from this scrape are forgotten
        return out

    def _one_pass(
        self, ts: float, readings: Sequence[Reading]
    ) -> tuple[list[Sample], dict[SeriesKey, _State], list[Reading], int]:
        """Every sample as if no group had reset, the new state, the counters that went backwards,
        and how many readings were not counters.

        The hot path of every scrape (hundreds of counters per node, measured in docs/counters.md
        "Performance"): one loop, locals only, no per-counter helper calls. The rules are those of
        the module docstring; a group reset only turns this pass's OK/WRAPPED samples into RESET
        (``apply_resets``), since the new baseline is the same either way.
        """
        get = self._state.get
        max_rate = self.max_rates.get
        default_max = self.default_max_rate
        counter_kind, ok, wrapped, reset, first, saturated = (
            Kind.COUNTER,
            Status.OK,
            Status.WRAPPED,
            Status.RESET,
            Status.FIRST,
            Status.SATURATED,
        )
        state: dict[SeriesKey, _State] = {}
        out: list[Sample] = []
        append = out.append
        backwards: list[Reading] = []
        others = 0
        for r in readings:
            if r.kind is not counter_kind:
                append(Sample(ts, r))
                others += 1
                continue
            key = r.series
            if key is None:
                key = r.series = (r.source, r.device, r.port, r.counter, r.labels)
            scale = r.scale
            raw = r.value / scale if scale != 1.0 and scale else r.value
            prev = get(key)
            if prev is not None and raw < prev[1]:
                backwards.append(r)
            if r.saturates and 0 < r.width <= 64 and raw >= _ALL_ONES[r.width]:
                since = ts if prev is None or prev[2] is None else prev[2]
                append(Sample(ts, r, None, saturated, since))
                state[key] = (ts, raw, since)
                continue
            state[key] = (ts, raw, None)
            if prev is None or ts <= prev[0]:  # first sighting, or a clock that stepped back: new baseline
                append(Sample(ts, r, None, first))
                continue
            delta = raw - prev[1]
            status = ok
            if delta < 0:  # a wrap, unless the group reset (then apply_resets replaces this sample)
                delta, status = delta + 2.0**r.width, wrapped
            rate = delta * scale / (ts - prev[0])
            if rate > max_rate(r.unit, default_max):
                append(Sample(ts, r, None, reset))
            else:
                append(Sample(ts, r, rate, status))
        return out, state, backwards, others

    def _update_with_duplicates(self, ts: float, readings: Sequence[Reading]) -> list[Sample]:
        """The two-pass algorithm, for a scrape that holds one series twice (no collector does).

        Kept so such input behaves as it always did: both readings are compared with the previous
        scrape's state to spot resets, and the second sees the baseline the first one left.
        """
        series = {k: _Series(*v) for k, v in self._state.items()}
        get = series.get
        seen: list[_Seen] = [
            (r, key, raw_of(r), get(key))
            for r in readings
            if r.kind is Kind.COUNTER
            for key in ((r.source, r.device, r.port, r.counter, r.labels),)
        ]
        groups = reset_groups_of([r for r, _key, raw, prev in seen if prev is not None and raw < prev.raw])
        state: dict[SeriesKey, _Series] = {}
        out: list[Sample] = []
        counters = iter(seen)
        for r in readings:
            if r.kind is not Kind.COUNTER:
                out.append(Sample(ts, r))
                continue
            c = next(counters)
            sample, state[c[1]] = self._counter(ts, c, group_of(r) in groups)
            out.append(sample)
        self._state = {k: (v.ts, v.raw, v.saturated_since) for k, v in state.items()}
        return out

    def _counter(self, ts: float, c: _Seen, group_reset: bool) -> tuple[Sample, _Series]:
        r, _key, raw, prev = c
        if is_saturated(r, raw):
            since = prev.saturated_since if prev is not None and prev.saturated_since is not None else ts
            return Sample(ts, r, None, Status.SATURATED, since), _Series(ts, raw, since)
        if prev is None or ts <= prev.ts:
            return Sample(ts, r, None, Status.FIRST), _Series(ts, raw)
        delta, dt = raw - prev.raw, ts - prev.ts
        prev.ts, prev.raw, prev.saturated_since = ts, raw, None  # shared with a repeat of the series
        if group_reset:
            return Sample(ts, r, None, Status.RESET), prev
        status = Status.OK
        if delta < 0:
            delta, status = delta + 2.0**r.width, Status.WRAPPED
        rate = delta * r.scale / dt
        if rate > self.max_rates.get(r.unit, self.default_max_rate):
            return Sample(ts, r, None, Status.RESET), prev
        return Sample(ts, r, rate, status), prev


def reset_groups_of(backwards: Iterable[Reading]) -> set[GroupKey]:
    """Groups where a counter that cannot wrap went backwards, or two counters did."""
    count: dict[GroupKey, int] = {}
    definite: set[GroupKey] = set()
    for r in backwards:
        group = group_of(r)
        count[group] = count.get(group, 0) + 1
        if not can_wrap(r):
            definite.add(group)
    return definite | {g for g, n in count.items() if n > 1}


def apply_resets(ts: float, samples: list[Sample], groups: set[GroupKey]) -> None:
    """Counters of a reset group get no rate this interval (FIRST and SATURATED samples stay)."""
    if not groups:
        return
    for i, s in enumerate(samples):
        r = s.reading
        if r.kind is Kind.COUNTER and s.status in (Status.OK, Status.WRAPPED) and group_of(r) in groups:
            samples[i] = Sample(ts, r, None, Status.RESET)
