"""Derived signals computed from one scrape's samples (``source="derived"``, gauges, unit in the name).

Only inputs with an honest rate (status OK or WRAPPED) are used: a first sighting, a reset or a
saturated counter yields no derived value rather than a wrong one. Assumptions and sources are in
``docs/counters.md`` ("Derived signals").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from fabricd.model import Kind, Labels, Reading, Sample, Status

SOURCE = "derived"
IB = "infiniband"
_HONEST = frozenset({Status.OK, Status.WRAPPED})
# DOMAIN.md: on Quantum switches lost bytes ~ delta(port_xmit_wait) x 8.
XMIT_WAIT_BYTES_PER_TICK = 8.0
GIGABYTE = 1e9
# Congestion notification packets, per second: (hw_counters name, derived name).
CNP_COUNTERS: tuple[tuple[str, str], ...] = (
    ("np_cnp_sent", "cnp_sent_packets_per_second"),
    ("rp_cnp_handled", "cnp_handled_packets_per_second"),
)
ERRORS_PER_GB: tuple[tuple[str, str], ...] = (
    ("symbol_error", "symbol_errors_per_gigabyte"),
    ("port_rcv_errors", "receive_errors_per_gigabyte"),
)
PAUSE_DURATIONS: dict[str, str] = {
    "rx_pause_duration": "rx_pause_ratio",
    "tx_pause_duration": "tx_pause_ratio",
}

Index = Mapping[tuple[str, str, str], Sample]  # (device, port, counter) -> infiniband sample


def derive(samples: Sequence[Sample]) -> list[Sample]:
    """Every derived signal the inputs allow."""
    honest = [s for s in samples if s.rate is not None and s.status in _HONEST]
    ib = {(s.reading.device, s.reading.port, s.reading.counter): s for s in honest if s.reading.source == IB}
    out: list[Sample] = []
    out.extend(ecn_marked_ratio(ib))
    out.extend(cnp_rates(ib))
    out.extend(xmit_wait_lost_bandwidth(ib))
    out.extend(errors_per_gigabyte(ib))
    out.extend(pause_ratios(honest))
    return out


def _derived(src: Sample, port: str, name: str, value: float, unit: str, labels: Labels = ()) -> Sample:
    r = src.reading
    return Sample(src.ts, Reading(SOURCE, r.device, port, name, value, unit, Kind.GAUGE, labels, name, 0))


def _rate(s: Sample) -> float:
    assert s.rate is not None  # derive() keeps only samples with a rate
    return s.rate


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


def ecn_marked_ratio(ib: Index) -> Iterator[Sample]:
    """delta(np_ecn_marked_roce_packets) / delta(port_rcv_packets), per device and port.

    Both are read within one scrape, so the ratio of rates is the ratio of deltas. hw_counters are
    cached by the driver (``lifespan``, ~10 ms) so the two deltas cover slightly different
    windows: the ratio is clamped to [0, 1]. A device-level ECN counter (port "") is matched to the
    device's only port; with several ports it is ambiguous and skipped.
    """
    for (device, port, counter), ecn in ib.items():
        if counter != "np_ecn_marked_roce_packets":
            continue
        rcv_port = port or _only_port(ib, device, "port_rcv_packets")
        rcv = ib.get((device, rcv_port or "", "port_rcv_packets"))
        if rcv is not None and _rate(rcv) > 0:
            ratio = _clamp01(_rate(ecn) / _rate(rcv))
            yield _derived(ecn, rcv.reading.port, "ecn_marked_ratio", ratio, "ratio")


def _only_port(ib: Index, device: str, counter: str) -> str | None:
    ports = {p for (d, p, c) in ib if d == device and c == counter and p}
    return ports.pop() if len(ports) == 1 else None


def cnp_rates(ib: Index) -> Iterator[Sample]:
    """CNPs sent as notification point and handled as reaction point, per second."""
    for raw, name in CNP_COUNTERS:
        for (_, _, counter), s in ib.items():
            if counter == raw:
                yield _derived(s, s.reading.port, name, _rate(s), "packets_per_second")


def xmit_wait_lost_bandwidth(ib: Index) -> Iterator[Sample]:
    """Estimated bandwidth lost to credit starvation: rate(port_xmit_wait) x 8 bytes per tick.

    An estimate: the x 8 holds for NVIDIA Quantum switch ports (DOMAIN.md); the tick length of an
    HCA port is implementation-defined, so compare it between ports of one kind, not across kinds.
    """
    for (_, port, counter), s in ib.items():
        if counter == "port_xmit_wait":
            yield _derived(s, port, "xmit_wait_lost_bytes_per_second", _rate(s) * XMIT_WAIT_BYTES_PER_TICK,
                           "bytes_per_second")  # fmt: skip


def errors_per_gigabyte(ib: Index) -> Iterator[Sample]:
    """Symbol and receive errors per 1e9 received bytes (``port_rcv_data`` is already in bytes)."""
    for (device, port, counter), s in ib.items():
        if counter != "port_rcv_data" or _rate(s) <= 0:
            continue
        gigabytes_per_second = _rate(s) / GIGABYTE
        for raw, name in ERRORS_PER_GB:
            err = ib.get((device, port, raw))
            if err is not None:
                yield _derived(err, port, name, _rate(err) / gigabytes_per_second, "errors_per_gigabyte")


def pause_ratios(samples: Sequence[Sample]) -> Iterator[Sample]:
    """Fraction of the interval a priority was paused: rate of pause seconds per second, in [0, 1].

    Inputs are the collectors' vendor-neutral ``rx_pause_duration``/``tx_pause_duration`` readings
    (already converted to seconds, label ``priority``), whatever the driver's own name.
    """
    for s in samples:
        r = s.reading
        name = PAUSE_DURATIONS.get(r.name)
        if name is not None and r.unit == "seconds":
            yield _derived(s, r.port, name, _clamp01(_rate(s)), "ratio", r.labels)
