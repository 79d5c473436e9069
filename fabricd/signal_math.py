"""The functions that compute fabricd's signals, and how one device's inputs are split into scopes.

The signal table (``fabricd/signal_table.py``) names, for each signal, its inputs and one of these
functions; the agent, the detectors and the report call it on the same scopes. Every function takes
the values of its input slots (a rate, a gauge's value, or None when the input is missing or has no
honest rate) and returns the signal's value, or None when the inputs do not allow one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fabricd.model import Labels

Values = Mapping[str, float]  # one scope: input name -> rate (counters) or value (gauges)
ScopeKey = tuple[str, Labels]  # (port, labels)
Slot = tuple[str, ...]  # alternative inputs, in order of preference

# ECN is judged on received packets. A RoCE port with real traffic receives 10^5..10^7 packets/s
# (100 Gb/s of 4 KiB MTU frames is 3 M/s); below 1,000/s (4 MB/s, management traffic of an idle
# port) a ratio is noise: in a 1 s scrape its resolution is 0.1 % and its binomial spread at the 2 %
# rule threshold is +-0.44 % (sqrt(0.02 x 0.98 / 1000)), so "above 2 %" means something; at 100
# packets it would be +-1.4 % and one marked packet would move it a whole point.
MIN_RECEIVED_PACKETS_PER_SECOND = 1000.0
# DOMAIN.md: on NVIDIA Quantum switch ports lost bytes ~ delta(port_xmit_wait) x 8 (one tick is the
# time of 8 bytes... at the port's rate). An estimate: on HCA ports the tick is implementation-defined,
# so compare ports of one kind, not across kinds.
XMIT_WAIT_BYTES_PER_TICK = 8.0
GIGABYTE = 1e9


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


def ecn_marked_ratio(v: Sequence[float | None]) -> float | None:
    """marked / received packets per second, from 1,000 received packets/s; clamped to [0, 1]
    (hw_counters are cached for ``lifespan`` ms, so the two rates cover slightly different windows)."""
    marked, received = v
    if marked is None or received is None or received < MIN_RECEIVED_PACKETS_PER_SECOND:
        return None
    return _clamp01(marked / received)


def value(v: Sequence[float | None]) -> float | None:
    """The input itself: a counter's rate (CNPs per second) or a gauge's level (backlog bytes)."""
    return v[0]


def ratio01(v: Sequence[float | None]) -> float | None:
    """A fraction of time already (seconds paused per second), clamped to [0, 1]."""
    return None if v[0] is None else _clamp01(v[0])


def total(v: Sequence[float | None]) -> float | None:
    """Sum of the inputs that have a value; None when none has (all saturated or absent)."""
    found = [x for x in v if x is not None]
    return sum(found) if found else None


def xmit_wait_lost_bytes_per_second(v: Sequence[float | None]) -> float | None:
    return None if v[0] is None else v[0] * XMIT_WAIT_BYTES_PER_TICK


def xmit_wait_ratio(v: Sequence[float | None]) -> float | None:
    """Bandwidth lost to XmitWait as a fraction of the link rate."""
    ticks, link = v
    if ticks is None or not link:
        return None
    return _clamp01(ticks * XMIT_WAIT_BYTES_PER_TICK / link)


def per_gigabyte(v: Sequence[float | None]) -> float | None:
    """errors per 1e9 received bytes (the IB data counters are already in bytes)."""
    errors, received = v
    if errors is None or received is None or received <= 0:
        return None
    return errors / (received / GIGABYTE)


def loss_ratio(v: Sequence[float | None]) -> float | None:
    """Probes never answered / probes sent: those timed out (``lost``) less those whose reply came
    after the timeout (``late``; None, from an agent that does not count them: none).

    A reply that came back was not dropped, however late: no fabric queue holds a packet for the
    prober's timeout (1 s by default; the deepest switch buffers drain in milliseconds, and a PFC
    pause that long is a storm the watchdog breaks and the pause counters show). A reply that late is
    a stalled host, the responder's or the prober's: a loaded live demo's probe responders stalled
    past the timeout at start-up, and a ``packet_loss`` incident opened on a healthy host link
    (docs/latency.md, "Lost means unanswered")."""
    sent, lost, late = (*v, None)[:3]
    if not sent or lost is None:
        return None
    return _clamp01((lost - (late or 0.0)) / sent)


def scopes(values: Mapping[tuple[str, str, Labels], float | None]) -> dict[ScopeKey, dict[str, float]]:
    """One device's inputs, ``(metric, port, labels) -> value``, grouped by (port, labels); missing
    values (None) dropped, device-level ones attached (``join_device_level``)."""
    out: dict[ScopeKey, dict[str, float]] = {}
    for (metric, port, labels), v in values.items():
        if v is not None:
            out.setdefault((port, labels), {})[metric] = v
    return join_device_level(out)


def join_device_level(out: dict[ScopeKey, dict[str, float]]) -> dict[ScopeKey, dict[str, float]]:
    """Device-level counters (port ``""``: mlx5 device hw_counters) join the device's port when it
    has exactly one; with several they cannot be attributed and are left out."""
    device = out.get(("", ()))
    if device is None:
        return out
    named = [k for k in out if k[0]]
    if named:
        del out[("", ())]
        if len({port for port, _ in named}) == 1:
            for key in named:
                if not key[1]:
                    out[key] = {**device, **out[key]}
    return out


def first(values: Values, slot: Slot) -> float | None:
    """The value of the slot's first input that has one."""
    for name in slot:
        v = values.get(name)
        if v is not None:
            return v
    return None
