"""Derived signals (fabricd.derived.derive) from two scrapes run through a real RateEngine."""

from __future__ import annotations

import pytest

from fabricd.counters import RateEngine
from fabricd.derived import derive
from fabricd.model import Kind, Reading, labels_of


def ib(counter: str, value: float, port: str = "1", *, width: int = 64, scale: float = 1.0) -> Reading:
    saturates = width < 64  # the narrow IB PortCounters clamp at all ones
    return Reading("infiniband", "mlx5_0", port, counter, value, "", Kind.COUNTER, (), "", width, saturates, scale)


def pause(direction: str, priority: str, seconds: float) -> Reading:
    return Reading("ethtool", "eth0", "", f"{direction}_prio{priority}_pause_duration", seconds, "seconds",
                   Kind.COUNTER, labels_of({"priority": priority}), f"{direction}_pause_duration")  # fmt: skip


def derived_after(before: list[Reading], after: list[Reading], dt: float = 1.0) -> dict[tuple[str, str, str], float]:
    engine = RateEngine()
    engine.update(100.0, before)
    samples = engine.update(100.0 + dt, after)
    out = derive(samples)
    assert all(s.reading.source == "derived" and s.reading.kind is Kind.GAUGE for s in out)
    return {(s.reading.device, s.reading.port, s.reading.counter): s.reading.value for s in out}


def test_ecn_marked_ratio() -> None:
    before = [ib("np_ecn_marked_roce_packets", 100), ib("port_rcv_packets", 10_000)]
    after = [ib("np_ecn_marked_roce_packets", 150), ib("port_rcv_packets", 11_000)]
    assert derived_after(before, after, dt=2.0)[("mlx5_0", "1", "ecn_marked_ratio")] == pytest.approx(0.05)


def test_device_level_ecn_counter_matches_the_only_port() -> None:
    before = [ib("np_ecn_marked_roce_packets", 0, port=""), ib("port_rcv_packets", 0)]
    after = [ib("np_ecn_marked_roce_packets", 10, port=""), ib("port_rcv_packets", 40)]
    assert derived_after(before, after)[("mlx5_0", "1", "ecn_marked_ratio")] == 0.25
    two_ports = [*before, ib("port_rcv_packets", 0, port="2")]
    assert derived_after(two_ports, [*after, ib("port_rcv_packets", 40, port="2")]) == {}  # ambiguous


def test_no_ecn_ratio_without_received_packets() -> None:
    same = [ib("np_ecn_marked_roce_packets", 5), ib("port_rcv_packets", 10)]
    assert "ecn_marked_ratio" not in {c for _, _, c in derived_after(same, same)}


def test_cnp_rates_per_second() -> None:
    before = [ib("np_cnp_sent", 1000), ib("rp_cnp_handled", 0)]
    after = [ib("np_cnp_sent", 1030), ib("rp_cnp_handled", 8)]
    got = derived_after(before, after, dt=2.0)
    assert got[("mlx5_0", "1", "cnp_sent_packets_per_second")] == 15.0
    assert got[("mlx5_0", "1", "cnp_handled_packets_per_second")] == 4.0


def test_xmit_wait_as_lost_bandwidth() -> None:
    got = derived_after([ib("port_xmit_wait", 0, width=32)], [ib("port_xmit_wait", 1000, width=32)])
    assert got[("mlx5_0", "1", "xmit_wait_lost_bytes_per_second")] == 8000.0  # DOMAIN.md: x 8 bytes/tick


def test_saturated_xmit_wait_gives_no_lost_bandwidth() -> None:
    stuck = [ib("port_xmit_wait", 2**32 - 1, width=32)]
    assert derived_after([ib("port_xmit_wait", 5, width=32)], stuck) == {}  # unknown, not zero


def test_errors_per_gigabyte() -> None:
    before = [ib("port_rcv_data", 0, scale=4.0), ib("symbol_error", 10), ib("port_rcv_errors", 1)]
    after = [ib("port_rcv_data", 4e9, scale=4.0), ib("symbol_error", 18), ib("port_rcv_errors", 2)]
    got = derived_after(before, after, dt=4.0)
    assert got[("mlx5_0", "1", "symbol_errors_per_gigabyte")] == 2.0
    assert got[("mlx5_0", "1", "receive_errors_per_gigabyte")] == 0.25


def test_pause_ratio_per_priority_clamped() -> None:
    before = [pause("rx", "3", 10.0), pause("tx", "3", 0.0), pause("rx", "4", 0.0)]
    after = [pause("rx", "3", 10.25), pause("tx", "3", 1.2), pause("rx", "4", 0.0)]
    engine = RateEngine()
    engine.update(0.0, before)
    out = derive(engine.update(1.0, after))
    got = {(s.reading.counter, dict(s.reading.labels)["priority"]): s.reading.value for s in out}
    assert got == {("rx_pause_ratio", "3"): 0.25, ("tx_pause_ratio", "3"): 1.0, ("rx_pause_ratio", "4"): 0.0}


def test_nothing_derived_on_first_scrape() -> None:
    engine = RateEngine()
    first = engine.update(1.0, [ib("np_cnp_sent", 5), ib("port_xmit_wait", 3), pause("rx", "3", 1.0)])
    assert derive(first) == []
