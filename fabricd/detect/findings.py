"""Per-series rule state: window averaging, ``for`` durations and hysteresis, in event time.

A *finding* is one rule firing on one series (a port, a probe pair, an NCCL op and size). Detectors
turn findings into incidents; this module only decides, sample by sample, whether a rule fires.

Semantics (Prometheus ``for``, with a clear level):

* the condition must hold on every observation from ``pending_since`` until ``ts``, and
  ``ts - pending_since >= for`` (so a burst shorter than ``for`` never fires);
* ``started_ts`` is the event time of the first observation that met the condition, not the time
  the ``for`` expired (what an engineer wants to know is when it began);
* once firing, the finding stays firing while the value meets ``clear`` (hysteresis);
* an observation gap longer than ``stale`` restarts the pending period: a series that stops
  reporting (a saturated counter has no rate) cannot keep a condition alive or complete a ``for``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fabricd.detect.rules import Rule
from fabricd.model import Labels, Severity

FOR_TOLERANCE_SECONDS = 0.5  # the engine's scrape-round tolerance: scrape times jitter less than this
# (rule name, node, device, port, labels)
FindingKey = tuple[str, str, str, str, Labels]


@dataclass(slots=True)
class Finding:
    rule: Rule
    node: str
    device: str  # HCA device, interface, probe peer or NCCL op, as the source names it
    port: str
    labels: Labels
    pending_since: float
    last_ts: float
    value: float
    peak: float
    firing: bool = False
    context: dict[str, float] = field(default_factory=dict)  # e.g. utilization at the time

    @property
    def started_ts(self) -> float:
        return self.pending_since

    @property
    def severity(self) -> Severity:
        return self.rule.severity_of(self.peak if self.rule.condition.op[0] == ">" else self.value)

    @property
    def signal(self) -> str:
        return self.rule.signal


class Tracker:
    """Holds every rule's per-series state; ``observe`` feeds one value, ``firing`` lists findings."""

    def __init__(self, stale_seconds: float) -> None:
        self.stale = stale_seconds
        self._state: dict[FindingKey, Finding] = {}
        self._firing: dict[FindingKey, Finding] = {}
        self._windows: dict[FindingKey, deque[tuple[float, float]]] = {}
        self.changed = False  # a finding started or stopped firing since the last ``take_changed``

    def observe(
        self, rule: Rule, node: str, device: str, port: str, labels: Labels, ts: float, value: float
    ) -> Finding | None:
        """Feed one observation; returns the finding when it is firing after this observation."""
        key = (rule.name, node, device, port, labels)
        f = self._state.get(key)
        if f is not None and ts <= f.last_ts:
            return f if f.firing else None  # a late observation does not rewrite the series' history
        if f is not None and ts - f.last_ts > self.stale:
            self._drop(key)
            f = None
        if rule.window_seconds > 0:
            value = _windowed(self._windows.setdefault(key, deque()), ts, value, rule.window_seconds)
        if f is None:
            return self._start(rule, key, ts, value) if rule.condition.holds(value) else None
        return self._update(f, key, ts, value)

    def _start(self, rule: Rule, key: FindingKey, ts: float, value: float) -> Finding | None:
        f = Finding(rule, key[1], key[2], key[3], key[4], ts, ts, value, value)
        self._state[key] = f
        return self._maybe_fire(f, key)

    def _update(self, f: Finding, key: FindingKey, ts: float, value: float) -> Finding | None:
        holds = f.rule.still_holds(value) if f.firing else f.rule.condition.holds(value)
        if not holds:
            self._drop(key)
            return None
        f.last_ts = ts
        f.value = value
        f.peak = max(f.peak, value) if f.rule.condition.op[0] == ">" else min(f.peak, value)
        return self._maybe_fire(f, key)

    def _maybe_fire(self, f: Finding, key: FindingKey) -> Finding | None:
        # ``for`` spans two observations at least; scrape times jitter by less than FOR_TOLERANCE,
        # so "for: 5s" on a 5 s interval means two consecutive scrapes, not three
        span = f.last_ts - f.pending_since
        if not f.firing and (span >= f.rule.for_seconds - FOR_TOLERANCE_SECONDS if f.rule.for_seconds else True):
            f.firing = True
            self._firing[key] = f
            self.changed = True
        return f if f.firing else None

    def _drop(self, key: FindingKey) -> None:
        f = self._state.pop(key, None)
        if f is not None and f.firing:
            del self._firing[key]
            self.changed = True

    def firing(self, now: float) -> list[Finding]:
        """Firing findings with a fresh observation (stale ones are dropped here)."""
        stale = [k for k, f in self._firing.items() if now - f.last_ts > self.stale]
        for key in stale:
            self._drop(key)
        return list(self._firing.values())

    def take_changed(self) -> bool:
        changed, self.changed = self.changed, False
        return changed

    def pending(self) -> int:
        return len(self._state)

    def pending_findings(self, now: float) -> list[Finding]:
        """Findings whose condition holds but whose ``for`` has not passed yet, observed recently.
        They cannot raise an incident, but they vote where one is: a node that scraped once since
        a fault began has the same symptom as one that scraped twice (fabricd.detect.base)."""
        return [f for f in self._state.values() if not f.firing and now - f.last_ts <= self.stale]


def _windowed(window: deque[tuple[float, float]], ts: float, value: float, span: float) -> float:
    """Mean over the last ``span`` seconds of event time, this observation included."""
    if window and ts - window[-1][0] > span:
        window.clear()  # a gap longer than the window: older values say nothing about now
    window.append((ts, value))
    while window and window[0][0] <= ts - span:
        window.popleft()
    return sum(v for _, v in window) / len(window)
