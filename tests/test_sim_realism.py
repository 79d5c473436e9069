"""The simulated hosts look and behave like real ones: same files and formats as a real ConnectX-7
capture, monotonic counters, 4-octet data words, 32-bit queue counters that wrap and narrow IB
counters that saturate, and the real collectors read them as they read a real host."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from collectors.infiniband import InfinibandCollector
from fabricd.collector import CollectorContext
from fabricd.counters import RateEngine
from fabricd.model import Status
from fabricd.sim.cluster import SimCluster, create
from fabricd.sim.scenario import Scenario, parse
from fabricd.sim.sysfstree import PORT_COUNTERS_BASE

FIXTURE = Path(__file__).parent / "fixtures" / "sim" / "gpud-h100-mlx5_0"
NUMBER = re.compile(rb"\d+\n?")


def _scenario(link_layer: str, faults: list[dict[str, object]], duration: str = "6m") -> Scenario:
    return parse(
        {
            "name": "t",
            "seed": 5,
            "duration": duration,
            "interval": "10s",
            "topology": {"nodes": 8, "hcas_per_node": 2, "nodes_per_leaf": 4, "spines": 2, "link_layer": link_layer},
            "faults": faults,
        }
    )


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _series(cluster: SimCluster, rel: str, steps: int) -> list[int]:
    path = cluster.sysfs_root("node-001") / "class" / "infiniband" / rel
    values = [int(path.read_text())]
    for k in range(1, steps + 1):
        cluster.advance_to(k * cluster.scenario.interval)
        values.append(int(path.read_text()))
    return values


def test_simulated_hca_has_the_files_and_formats_of_a_real_connectx7(tmp_path: Path) -> None:
    cluster = create(_scenario("infiniband", []), tmp_path, 1.7e9)
    sim = _files(cluster.sysfs_root("node-001") / "class" / "infiniband" / "mlx5_0")
    real = _files(FIXTURE)
    assert set(sim) == set(real)
    # The gpud capture stores values without the newline the kernel prints (sysfs_emit "%u\n", as in
    # the procfs and node_exporter captures): compare the values, and expect the newline in ours.
    for name, data in real.items():
        assert sim[name].endswith(b"\n"), name
        if NUMBER.fullmatch(data):
            assert NUMBER.fullmatch(sim[name]), name
        else:
            assert sim[name].rstrip(b"\n") == data, name


def test_roce_port_adds_only_the_mlx5_congestion_counters_and_ethtool_text(tmp_path: Path) -> None:
    cluster = create(_scenario("roce", []), tmp_path, 1.7e9)
    sim = _files(cluster.sysfs_root("node-001") / "class" / "infiniband" / "mlx5_0")
    extra = {Path(n).name for n in set(sim) - set(_files(FIXTURE))}
    assert extra == {"np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored"}
    assert sim["ports/1/link_layer"] == b"Ethernet\n"
    text = (cluster.ethtool_dir("node-001") / "mlx5_0.txt").read_text()
    assert text.startswith("NIC statistics:\n     rx_packets: ")
    assert "     rx_prio3_pause_duration: " in text and "     tx_pause_storm_warning_events: " in text


def test_data_counters_count_4_octet_words_and_only_go_up(tmp_path: Path) -> None:
    cluster = create(_scenario("roce", []), tmp_path, 1.7e9)
    ethtool = cluster.ethtool_dir("node-001") / "mlx5_0.txt"

    def phy_tx_bytes() -> int:
        return int(re.search(r"tx_bytes_phy: (\d+)", ethtool.read_text()).group(1))  # type: ignore[union-attr]

    before = phy_tx_bytes()
    words = _series(cluster, "mlx5_0/ports/1/counters/port_xmit_data", 6)
    assert words == sorted(words) and words[-1] > words[0]
    # The RDMA bytes the NIC put on the wire (ethtool, bytes) are 4 x the PMA's words.
    assert (words[-1] - words[0]) * 4 == pytest.approx(phy_tx_bytes() - before, rel=1e-6)


def test_32_bit_queue_counters_wrap_and_the_rate_engine_unwraps_them(tmp_path: Path) -> None:
    cluster = create(_scenario("infiniband", [], duration="20m"), tmp_path, 1.7e9)
    collector = InfinibandCollector(CollectorContext("node-001", cluster.sysfs_root("node-001")))
    engine, statuses, values = RateEngine(), [], []
    for k in range(0, 120):
        cluster.advance_to(k * 10.0)
        readings = [r for r in collector.scrape() if r.counter == "rx_write_requests" and r.device == "mlx5_0"]
        values.append(readings[0].value)
        sample = engine.update(1.7e9 + k * 10, readings)[0]
        statuses.append(sample.status)
        assert sample.rate is None or sample.rate > 0
    collector.close()
    assert max(values) < 2**32
    assert Status.WRAPPED in statuses  # went backwards once: a wrap, not a reset
    assert Status.RESET not in statuses


def test_narrow_counters_saturate_at_all_ones(tmp_path: Path) -> None:
    # Heavy congestion stalls the senders crossing leaf-01~spine-01: port_xmit_wait (32 bits) fills.
    sc = _scenario(
        "infiniband", [{"kind": "congestion", "at": "leaf-01~spine-01", "start": "10s", "end": "6m", "severity": 1.0}]
    )
    cluster = create(sc, tmp_path, 1.7e9)
    for k in range(1, 37):
        cluster.advance_to(k * 10.0)
    waits = []
    for node in cluster.nodes:
        for dev in ("mlx5_0", "mlx5_1"):
            path = cluster.sysfs_root(node) / "class/infiniband" / dev / "ports/1/counters/port_xmit_wait"
            waits.append(int(path.read_text()))
    assert max(waits) == 2**32 - 1
    assert all(w <= 2**32 - 1 for w in waits)
    widths = PORT_COUNTERS_BASE
    for name, width in widths.items():
        path = cluster.sysfs_root("node-001") / "class/infiniband/mlx5_0/ports/1/counters" / name
        assert int(path.read_text()) <= 2**width - 1, name


def test_link_flap_toggles_state_and_counts_link_downed(tmp_path: Path) -> None:
    sc = _scenario(
        "infiniband",
        [{"kind": "link_flap", "at": "node-001/mlx5_0~leaf-01", "start": "10s", "end": "6m", "severity": 1.0}],
    )
    cluster = create(sc, tmp_path, 1.7e9)
    port = cluster.sysfs_root("node-001") / "class/infiniband/mlx5_0/ports/1"
    states = set()
    for k in range(1, 37):
        cluster.advance_to(k * 10.0)
        states.add((port / "state").read_text())
    assert states == {"4: ACTIVE\n", "1: DOWN\n"}
    assert int((port / "counters" / "link_downed").read_text()) >= 3


def test_collectors_read_a_simulated_node_like_a_real_one(tmp_path: Path) -> None:
    from collectors.ethtool import EthtoolCollector, EthtoolOptions

    cluster = create(_scenario("roce", []), tmp_path, 1.7e9)
    ib = InfinibandCollector(CollectorContext("node-001", cluster.sysfs_root("node-001")))
    eth = EthtoolCollector(
        CollectorContext("node-001", options=EthtoolOptions(stats_dir=cluster.ethtool_dir("node-001")))
    )
    ib_readings = ib.scrape()
    eth_readings = asyncio.run(eth.collect())
    ib.close()
    words = int((cluster.sysfs_root("node-001") / "class/infiniband/mlx5_0/ports/1/counters/port_rcv_data").read_text())
    rcv = next(r for r in ib_readings if r.device == "mlx5_0" and r.counter == "port_rcv_data")
    assert rcv.value == words * 4 and rcv.unit == "bytes"
    pause = [r for r in eth_readings if r.metric == "rx_pause_duration"]
    assert {r.device for r in pause} == {"mlx5_0", "mlx5_1"}
    assert all(dict(r.labels)["priority"] == "3" for r in pause)


@pytest.mark.parametrize("link_layer", ["infiniband", "roce"])
def test_no_port_moves_more_than_its_line_rate(tmp_path: Path, link_layer: str) -> None:
    """Load skew and jitter may ask more of a port than its link carries; the simulated flows slow
    down instead (as congestion control would), so data counters never show > 100 % utilization."""
    sc = parse(
        {
            "name": "t",
            "seed": 3,
            "duration": "5m",
            "interval": "10s",
            "topology": {"nodes": 16, "hcas_per_node": 2, "nodes_per_leaf": 4, "spines": 2, "link_layer": link_layer},
            "workload": {"kind": "allreduce", "load": 0.9, "noise": 0.3},
        }
    )
    cluster = create(sc, tmp_path, 1.7e9)
    line = cluster.sim.fabric.line_bytes_per_second
    ports = [(node, f"mlx5_{h}") for node in cluster.nodes for h in range(2)]

    def words() -> dict[tuple[str, str, str], int]:
        out = {}
        for node, dev in ports:
            base = cluster.sysfs_root(node) / "class" / "infiniband" / dev / "ports" / "1" / "counters"
            for name in ("port_xmit_data", "port_rcv_data"):
                out[(node, dev, name)] = int((base / name).read_text())
        return out

    before, busiest = words(), 0.0
    for k in range(1, 31):
        cluster.advance_to(k * 10.0)
        now = words()
        for key, value in now.items():
            busiest = max(busiest, (value - before[key]) * 4 / 10.0 / line)
        before = now
    assert 0.7 < busiest <= 1.0 + 1e-9
