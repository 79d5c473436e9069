"""Counter semantics (fabricd.counters.RateEngine) on sequences of real-format sysfs trees.

Each scenario writes a tree with fabricd.sim.sysfstree, reads it with the infiniband collector as the
agent would, and feeds the readings to one RateEngine with explicit scrape timestamps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.infiniband import InfinibandCollector
from fabricd.collector import CollectorContext
from fabricd.counters import DEFAULT_MAX_RATE, DEFAULT_MAX_RATES, RateEngine
from fabricd.model import Kind, Reading, Sample, Status
from fabricd.sim.sysfstree import DeviceTree, PortTree, write_infiniband_tree

U32 = 2**32


class Host:
    """A written sysfs tree, the collector reading it and the engine turning readings into rates."""

    def __init__(self, root: Path, engine: RateEngine | None = None) -> None:
        self.root = root
        self.collector = InfinibandCollector(CollectorContext(node="n1", sysfs_root=root))
        self.engine = engine if engine is not None else RateEngine()

    def scrape(self, ts: float, devices: dict[str, DeviceTree]) -> dict[tuple[str, str, str], Sample]:
        write_infiniband_tree(self.root, devices)
        samples = self.engine.update(ts, self.collector.scrape())
        return {(s.reading.device, s.reading.port, s.reading.counter): s for s in samples}


def hca(counters: dict[str, int] | None = None, hw: dict[str, int] | None = None) -> dict[str, DeviceTree]:
    base = {"port_rcv_data": 1000, "port_rcv_packets": 100, "symbol_error": 0, "port_xmit_wait": 0}
    hw_base = {"out_of_sequence": 0, "packet_seq_err": 0, "np_ecn_marked_roce_packets": 0}
    port = PortTree(counters={**base, **(counters or {})}, hw_counters={**hw_base, **(hw or {})})
    return {"mlx5_0": DeviceTree(ports={"1": port})}


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def test_first_sighting_then_rate_in_bytes(host: Host) -> None:
    first = host.scrape(100.0, hca({"port_rcv_data": 1000}))
    assert first[("mlx5_0", "1", "port_rcv_data")].status is Status.FIRST
    assert first[("mlx5_0", "1", "port_rcv_data")].rate is None
    later = host.scrape(102.0, hca({"port_rcv_data": 1000 + 250_000_000}))
    s = later[("mlx5_0", "1", "port_rcv_data")]
    assert (s.status, s.rate) == (Status.OK, 500_000_000.0)  # 250e6 words x 4 bytes / 2 s


def test_gauges_and_info_pass_through(host: Host) -> None:
    got = host.scrape(1.0, hca())
    for counter in ("state", "rate", "port_info", "info"):
        port = "" if counter == "info" else "1"
        s = got[("mlx5_0", port, counter)]
        assert (s.status, s.rate) == (Status.OK, None)
    assert got[("mlx5_0", "1", "rate")].reading.value == 5e10


def test_32bit_queue_counter_wraps(host: Host) -> None:
    host.scrape(10.0, hca(hw={"out_of_sequence": U32 - 6}))
    got = host.scrape(12.0, hca(hw={"out_of_sequence": 4}))
    s = got[("mlx5_0", "1", "out_of_sequence")]
    assert (s.status, s.rate) == (Status.WRAPPED, 5.0)  # (4 + 2^32 - (2^32 - 6)) / 2 s
    assert got[("mlx5_0", "1", "port_rcv_data")].status is Status.OK  # the rest of the port is fine


def test_two_counters_backwards_is_a_reset_not_two_wraps(host: Host) -> None:
    host.scrape(10.0, hca(hw={"out_of_sequence": 5000, "packet_seq_err": 300}))
    got = host.scrape(11.0, hca(hw={"out_of_sequence": 2, "packet_seq_err": 0}))
    assert got[("mlx5_0", "1", "out_of_sequence")].status is Status.RESET
    assert got[("mlx5_0", "1", "packet_seq_err")].status is Status.RESET
    assert all(s.rate is None for s in got.values())
    after = host.scrape(12.0, hca(hw={"out_of_sequence": 12, "packet_seq_err": 1}))
    assert after[("mlx5_0", "1", "out_of_sequence")].rate == 10.0  # baseline restarted at 2


def test_64bit_counter_backwards_is_a_reset(host: Host) -> None:
    host.scrape(10.0, hca({"port_rcv_data": 10**12}, hw={"out_of_sequence": 50}))
    got = host.scrape(11.0, hca({"port_rcv_data": 10}, hw={"out_of_sequence": 1}))
    # the driver reloaded: the 32-bit counter's drop is part of the reset, not a wrap
    for counter in ("port_rcv_data", "out_of_sequence", "port_rcv_packets"):
        s = got[("mlx5_0", "1", counter)]
        assert (s.status, s.rate) == (Status.RESET, None)
    after = host.scrape(12.0, hca({"port_rcv_data": 110}, hw={"out_of_sequence": 3}))
    assert after[("mlx5_0", "1", "port_rcv_data")].rate == 400.0


def test_saturated_counter_reports_since_and_no_rate(host: Host) -> None:
    host.scrape(10.0, hca({"port_xmit_wait": U32 - 100}))
    got = [host.scrape(t, hca({"port_xmit_wait": U32 - 1, "symbol_error": 65535})) for t in (11.0, 12.0)]
    for scrape in got:
        wait = scrape[("mlx5_0", "1", "port_xmit_wait")]
        assert (wait.status, wait.rate, wait.since) == (Status.SATURATED, None, 11.0)
        sym = scrape[("mlx5_0", "1", "symbol_error")]  # 16-bit, at all ones
        assert (sym.status, sym.since) == (Status.SATURATED, 11.0)
    # somebody cleared the counters (perfquery -R): a reset, then honest rates again
    cleared = host.scrape(13.0, hca({"port_xmit_wait": 10, "symbol_error": 0}))
    assert cleared[("mlx5_0", "1", "port_xmit_wait")].status is Status.RESET
    assert host.scrape(14.0, hca({"port_xmit_wait": 30}))[("mlx5_0", "1", "port_xmit_wait")].rate == 20.0


def test_saturated_on_first_sighting(host: Host) -> None:
    s = host.scrape(5.0, hca({"port_xmit_wait": U32 - 1}))[("mlx5_0", "1", "port_xmit_wait")]
    assert (s.status, s.since, s.rate) == (Status.SATURATED, 5.0, None)


def test_legacy_32bit_data_counter_saturates_in_words(tmp_path: Path) -> None:
    # pre-4.5 kernel (counters_ext/ present): counters/port_xmit_data is 32-bit PortCounters
    # data, clamped at 0xFFFFFFFF *words*: saturation must be judged on the raw value, not bytes.
    host = Host(tmp_path)
    port = PortTree(counters={"port_xmit_data": U32 - 1}, counters_ext={"port_xmit_data_64": 7 * U32})
    got = host.scrape(1.0, {"mlx4_0": DeviceTree(ports={"1": port})})
    s = got[("mlx4_0", "1", "port_xmit_data")]
    assert s.status is Status.SATURATED
    assert s.reading.value == (U32 - 1) * 4


def test_implausible_jump_is_a_reset(tmp_path: Path) -> None:
    host = Host(tmp_path, RateEngine(max_rates={**DEFAULT_MAX_RATES, "packets": 1000.0}))
    host.scrape(1.0, hca(hw={"out_of_sequence": 100}))
    got = host.scrape(2.0, hca(hw={"out_of_sequence": 50}))  # a "wrap" of ~4e9 packets in 1 s
    s = got[("mlx5_0", "1", "out_of_sequence")]
    assert (s.status, s.rate) == (Status.RESET, None)
    data = host.scrape(3.0, hca({"port_rcv_data": 10**15}))  # 4e15 bytes in 1 s: 32 Pb/s
    assert data[("mlx5_0", "1", "port_rcv_data")].status is Status.RESET


def test_vanished_device_is_forgotten_and_restarts_first(host: Host) -> None:
    two = {**hca(), "mlx5_1": hca()["mlx5_0"]}
    host.scrape(1.0, two)
    host.scrape(2.0, two)
    size_with_two = host.engine.tracked_series
    host.scrape(3.0, hca())
    assert host.engine.tracked_series < size_with_two
    back = host.scrape(4.0, two)
    assert back[("mlx5_1", "1", "port_rcv_data")].status is Status.FIRST
    assert back[("mlx5_0", "1", "port_rcv_data")].status is Status.OK


def test_clock_stepping_back_gives_no_rate(host: Host) -> None:
    host.scrape(10.0, hca())
    s = host.scrape(9.0, hca({"port_rcv_data": 2000}))[("mlx5_0", "1", "port_rcv_data")]
    assert (s.status, s.rate) == (Status.FIRST, None)


# --- property: whatever the counters do, no negative or impossible rate leaves the engine ----------

_WIDTHS = st.sampled_from([(4, True), (8, True), (16, True), (32, True), (32, False), (64, False)])


@st.composite
def _series(draw: st.DrawFn) -> list[tuple[float, list[Reading]]]:
    specs = draw(st.lists(st.tuples(_WIDTHS, st.sampled_from([1.0, 4.0])), min_size=1, max_size=4))
    scrapes, ts = [], 0.0
    for _ in range(draw(st.integers(2, 6))):
        ts += draw(st.floats(0.001, 30.0))
        readings = []
        for i, ((width, sat), scale) in enumerate(specs):
            raw = draw(st.integers(0, 2**width - 1))
            readings.append(
                Reading(
                    "x",
                    "d",
                    "1",
                    f"c{i}",
                    raw * scale,
                    "bytes" if scale == 4 else "",
                    Kind.COUNTER,
                    (),
                    "",
                    width,
                    sat,
                    scale,
                )
            )
        scrapes.append((ts, readings))
    return scrapes


@settings(max_examples=200, deadline=None)
@given(_series())
def test_rates_are_never_negative_or_impossible(series: list[tuple[float, list[Reading]]]) -> None:
    engine = RateEngine()
    for ts, readings in series:
        for s in engine.update(ts, readings):
            if s.rate is not None:
                assert 0 <= s.rate <= DEFAULT_MAX_RATES.get(s.reading.unit, DEFAULT_MAX_RATE)
                assert s.status in {Status.OK, Status.WRAPPED}
            else:
                assert s.status in {Status.FIRST, Status.RESET, Status.SATURATED}


def test_real_capture_shows_saturated_error_counters() -> None:
    # The gpud H100 capture holds excessive_buffer_overrun_errors = 15 (4-bit all ones) on every
    # HCA and link_downed = 255 (8-bit) on mlx5_1: "unknown since", not "no new errors".
    sys_root = Path(__file__).parent / "cases" / "infiniband" / "gpud-h100" / "sys"
    c = InfinibandCollector(CollectorContext(node="n1", sysfs_root=sys_root))
    engine = RateEngine()
    engine.update(1.0, c.scrape())
    saturated = {
        (s.reading.device, s.reading.counter) for s in engine.update(2.0, c.scrape()) if s.status is Status.SATURATED
    }
    assert ("mlx5_1", "link_downed") in saturated
    assert {d for d, c in saturated if c == "excessive_buffer_overrun_errors"} == {
        "mlx5_0",
        "mlx5_1",
        "mlx5_4",
        "mlx5_5",
        "mlx5_6",
        "mlx5_7",
        "mlx5_8",
        "mlx5_9",
        "mlx5_bond_0",
    }
    assert len(saturated) == 10
