"""Derived signals (fabricd.derived.derive) from two scrapes run through a real RateEngine."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from collectors import REGISTRY
from fabricd.catalogue import lookup
from fabricd.collector import build
from fabricd.counters import RateEngine
from fabricd.derived import derive
from fabricd.drivers import ib as ib_tables
from fabricd.drivers.ib import pma
from fabricd.exposition import render
from fabricd.model import Kind, Reading, labels_of
from fabricd.sim.sysfstree import DeviceTree, PortTree, write_infiniband_tree
from tests.helpers import CASES


def ib(counter: str, value: float, port: str = "1", *, width: int = 64, scale: float = 1.0) -> Reading:
    """A reading as the infiniband collector makes it for an mlx5 file: raw name, neutral name."""
    saturates = width < 64  # the narrow IB PortCounters clamp at all ones
    row = pma.COUNTERS.get(counter) or ib_tables.hw_counter("mlx5", counter)
    assert row is not None and row.name, counter
    return Reading(
        "infiniband", "mlx5_0", port, counter, value, row.unit, Kind.COUNTER, (), row.name, width, saturates, scale
    )


def pause(direction: str, priority: str, seconds: float) -> Reading:
    return Reading(
        "ethtool",
        "eth0",
        "",
        f"{direction}_prio{priority}_pause_duration",
        seconds,
        "seconds",
        Kind.COUNTER,
        labels_of({"priority": priority}),
        f"{direction}_pause_duration",
    )


def derived_after(before: list[Reading], after: list[Reading], dt: float = 1.0) -> dict[tuple[str, str, str], float]:
    engine = RateEngine()
    engine.update(100.0, before)
    samples = engine.update(100.0 + dt, after)
    out = derive(samples)
    assert all(s.reading.source == "derived" and s.reading.kind is Kind.GAUGE for s in out)
    return {(s.reading.device, s.reading.port, s.reading.counter): s.reading.value for s in out}


def test_ecn_marked_ratio() -> None:
    before = [ib("np_ecn_marked_roce_packets", 100), ib("port_rcv_packets", 10_000)]
    after = [ib("np_ecn_marked_roce_packets", 300), ib("port_rcv_packets", 14_000)]
    assert derived_after(before, after, dt=2.0)[("mlx5_0", "1", "ecn_marked_ratio")] == pytest.approx(0.05)


@pytest.mark.parametrize(("received", "expected"), [(999, None), (1000, 0.25)])
def test_no_ecn_ratio_below_1000_received_packets_per_second(received: int, expected: float | None) -> None:
    before = [ib("np_ecn_marked_roce_packets", 0), ib("port_rcv_packets", 0)]
    after = [ib("np_ecn_marked_roce_packets", received // 4), ib("port_rcv_packets", received)]
    got = derived_after(before, after).get(("mlx5_0", "1", "ecn_marked_ratio"))
    assert got == (None if expected is None else pytest.approx(expected, rel=1e-3))


def test_device_level_ecn_counter_matches_the_only_port() -> None:
    before = [ib("np_ecn_marked_roce_packets", 0, port=""), ib("port_rcv_packets", 0)]
    after = [ib("np_ecn_marked_roce_packets", 1000, port=""), ib("port_rcv_packets", 4000)]
    assert derived_after(before, after)[("mlx5_0", "1", "ecn_marked_ratio")] == 0.25
    two_ports = [*before, ib("port_rcv_packets", 0, port="2")]
    assert derived_after(two_ports, [*after, ib("port_rcv_packets", 4000, port="2")]) == {}  # ambiguous


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


# --- NCCL-tests efficiency: measured busbw over the model's prediction on this node's ports ---------

GIB8 = 8 * 2**30


NCCL_NAMES = {"busbw": "busbw_bytes_per_second"}  # the collector's neutral names (collectors/nccl.py)


def nccl(counter: str, value: float, op: str = "all_reduce", **labels: str) -> Reading:
    name = NCCL_NAMES.get(counter, counter)
    return Reading("nccl", op, "", counter, value, "", Kind.GAUGE, labels_of(labels), name, 0)


def ib_port(device: str, rate: float, *, state: float = 4.0, layer: str = "InfiniBand") -> list[Reading]:
    return [
        Reading("infiniband", device, "1", "rate", rate, "bytes_per_second", Kind.GAUGE, (), "link_rate", 0),
        Reading("infiniband", device, "1", "state", state, "", Kind.GAUGE, (), "port_state", 0),
        Reading(
            "infiniband", device, "1", "port_info", 1.0, "", Kind.INFO, labels_of({"link_layer": layer}), "port_info", 0
        ),
    ]


def one_scrape(readings: list[Reading]) -> dict[tuple[str, str], float]:
    out = derive(RateEngine().update(100.0, readings))
    return {
        (s.reading.device, dict(s.reading.labels)["size"]): s.reading.value
        for s in out
        if s.reading.counter == "nccl_efficiency"
    }


def a_run(busbw: float, *, nodes: float = 2, ranks: float = 16) -> list[Reading]:
    """A 2 x 8-GPU all_reduce: a mid-size row, in-place rows, and 8 GiB out of place."""
    return [
        nccl("busbw", 1e9, size=str(2**20), placement="out_of_place"),
        nccl("busbw", 9e11, size=str(GIB8), placement="in_place"),
        nccl("busbw", busbw, size=str(GIB8), placement="out_of_place"),
        nccl("nodes", nodes),
        nccl("ranks", ranks),
    ]


NDR = 400 * 125_000_000.0  # "400 Gb/sec (4X NDR)" in bytes/s
EIGHT_NDR_PORTS = [r for i in range(8) for r in ib_port(f"mlx5_{i}", NDR)]


def test_nccl_efficiency_against_the_closed_form_ring_prediction() -> None:
    # Ring all_reduce on p = 16 ranks, N = 2 nodes, 8 x 400 Gb/s at the model's default 0.9 of line
    # rate: B = 8 x 50e9 x 0.9 = 360e9 B/s; each node sends 2(p-1)/p n = 1.875 n bytes in
    # 2(p-1) = 30 steps of alpha = 8 us; busbw = algbw x 1.875 (nccl-tests PERFORMANCE.md).
    t = 30 * 8e-6 + 1.875 * GIB8 / 360e9
    predicted = GIB8 / t * 1.875  # 358.08 GB/s
    down = ib_port("mlx5_8", NDR, state=1.0)  # a port that is down is not part of the fabric
    ethernet = ib_port("mlx5_9", NDR, layer="Ethernet")  # an active RoCE port next to IB ones
    got = one_scrape([*a_run(180e9), *EIGHT_NDR_PORTS, *down, *ethernet])
    assert got == {("all_reduce", str(GIB8)): pytest.approx(180e9 / predicted, rel=1e-12)}
    assert got[("all_reduce", str(GIB8))] == pytest.approx(0.5027, abs=1e-4)


def test_nccl_efficiency_uses_the_collectors_model_assumptions() -> None:
    # Tree all_reduce, 0.8 of line rate: B = 320e9; 2(N-1)/N n = n bytes per node over the network
    # in 2 log2(16) = 8 steps; busbw = n / t x 1.875.
    t = 8 * 8e-6 + GIB8 / 320e9
    tree = [*a_run(300e9), nccl("model_efficiency", 0.8, algo="tree"), *EIGHT_NDR_PORTS]
    assert one_scrape(tree)[("all_reduce", str(GIB8))] == pytest.approx(300e9 / (GIB8 / t * 1.875), rel=1e-12)


def test_no_nccl_efficiency_without_every_input() -> None:
    assert one_scrape(a_run(180e9)) == {}  # no fabric ports in the scrape
    assert one_scrape([*a_run(180e9)[:3], *EIGHT_NDR_PORTS]) == {}  # shape unknown
    assert one_scrape([*a_run(180e9, nodes=1, ranks=8), *EIGHT_NDR_PORTS]) == {}  # NVLink-bound: not modelled
    assert one_scrape([*ib_port("mlx5_0", NDR, state=1.0), *a_run(180e9)]) == {}  # no active port
    assert one_scrape(EIGHT_NDR_PORTS) == {}  # no run this scrape


async def test_a_real_healthy_run_scores_near_one(tmp_path: Path) -> None:
    # The 2 x 8 H100 A3 Mega capture (tree, 8 x 200 Gb/s NICs) through the real collectors: with the
    # efficiency calibrated on it (0.87, docs/model.md) the run scores within the model's 9 %.
    ports = {f"mlx5_{i}": DeviceTree(ports={"1": PortTree(rate="200 Gb/sec (4X HDR)")}) for i in range(8)}
    write_infiniband_tree(tmp_path / "sys", ports)
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(CASES / "nccl/a3mega_all_reduce_2node_16xH100/input.txt", logs / "all_reduce_perf.log")
    nccl_options = {"log_glob": str(logs / "*.log"), "settle_seconds": 0, "algo": "tree", "model_efficiency": 0.87}
    readings: list[Reading] = []
    for name, options in (("infiniband", {}), ("nccl", nccl_options)):
        collector = build(name, options, node="n1", sysfs_root=tmp_path / "sys", registry=REGISTRY)
        readings += await collector.collect()
    got = one_scrape(readings)
    assert list(got) == [("all_reduce", str(GIB8))]
    assert 0.91 <= got[("all_reduce", str(GIB8))] <= 1.09


def test_nccl_efficiency_is_exported_under_its_catalogued_name() -> None:
    samples = derive(RateEngine().update(100.0, [*a_run(180e9), *EIGHT_NDR_PORTS]))
    text = render(samples, "node-001").decode()
    family = "fabricd_derived_nccl_efficiency_ratio"
    assert f'{family}{{device="all_reduce",node="node-001",size="{GIB8}"}} 0.50' in text
    spec = lookup(family)
    assert spec is not None and spec.type == "gauge" and set(spec.labels) == {"node", "device", "size"}
    assert f"# HELP {family} NCCL-tests busbw at the run's largest out-of-place size" in text


async def test_the_agent_says_which_model_it_judged_a_run_against(tmp_path: Path) -> None:
    # The same real run on a sysfs tree of 8 x 200 Gb/s ports, two of them down: the info series
    # beside the efficiency names the ports the agent counted (6 active, from sysfs) and the run's shape.
    ports = {
        f"mlx5_{i}": DeviceTree(
            ports={"1": PortTree(rate="200 Gb/sec (4X HDR)", state="4: ACTIVE" if i < 6 else "1: DOWN")}
        )
        for i in range(8)
    }
    write_infiniband_tree(tmp_path / "sys", ports)
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(CASES / "nccl/a3mega_all_reduce_2node_16xH100/input.txt", logs / "all_reduce_perf.log")
    nccl_options = {"log_glob": str(logs / "*.log"), "settle_seconds": 0, "algo": "tree", "model_efficiency": 0.87}
    readings: list[Reading] = []
    for name, options in (("infiniband", {}), ("nccl", nccl_options)):
        collector = build(name, options, node="n1", sysfs_root=tmp_path / "sys", registry=REGISTRY)
        readings += await collector.collect()
    text = render(derive(RateEngine().update(100.0, readings)), "n1").decode()
    family = "fabricd_derived_nccl_efficiency_model_info"
    model = [line for line in text.splitlines() if line.startswith(family + "{")]
    assert model == [
        f'{family}{{algo="tree",device="all_reduce",efficiency="0.87",gpus_per_node="8",hcas="6",'
        f'link_rate_gbps="200",node="n1",nodes="2",size="{GIB8}"}} 1.0'
    ]
    spec = lookup(family)
    assert spec is not None and set(spec.labels) == {
        "node",
        "device",
        "size",
        "hcas",
        "link_rate_gbps",
        "nodes",
        "gpus_per_node",
        "algo",
        "efficiency",
    }
