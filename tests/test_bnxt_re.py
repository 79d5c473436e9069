"""A driver added as one table: Broadcom bnxt_re is read, exported and detected like mlx5.

The bnxt_re case tree (tests/cases/infiniband/bnxt_re-kernel-names: the kernel's counter names,
synthetic values) goes through the real infiniband collector; a RoCE port of each driver then
carries the same traffic for a minute (ECN marks, CNPs, sequence errors, retransmissions, drops)
and both are fed to one detection engine: the same signals with the same values, the same rules
firing, and nothing in fabricd/detect/ knows either driver's names.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from collectors.infiniband import InfinibandCollector
from fabricd.collector import CollectorContext
from fabricd.counters import RateEngine
from fabricd.detect.engine import DetectionEngine
from fabricd.detect.signals import Extractor
from fabricd.exposition import render
from fabricd.model import Kind, Labels, Reading, Sample
from fabricd.sim.sysfstree import DeviceTree, PortTree, write_infiniband_tree
from tests.helpers import CASES, REPO

CASE = CASES / "infiniband" / "bnxt_re-kernel-names"
HW = CASE / "sys/class/infiniband/bnxt_re0/ports/1/hw_counters"
T0, STEP, ROUNDS = 1_700_000_000.0, 10.0, 7
# Per 10 s interval, the same traffic counted by each driver under its own names.
PER_INTERVAL = {
    "received": 40_000_000,  # RoCE packets received
    "marked": 4_800_000,  # ECN CE: 12 %
    "cnp_sent": 300_000,
    "cnp_handled": 250_000,
    "out_of_sequence": 200,
    "sequence_naks": 150,
    "timeouts": 400,
    "discards": 30,
}
MLX5_NAMES = {
    "marked": "np_ecn_marked_roce_packets",
    "cnp_sent": "np_cnp_sent",
    "cnp_handled": "rp_cnp_handled",
    "out_of_sequence": "out_of_sequence",
    "sequence_naks": "packet_seq_err",
    "timeouts": "local_ack_timeout_err",
}
BNXT_NAMES = {
    "received": "rx_roce_only_pkts",
    "marked": "rx_ecn_marked_pkts",
    "cnp_sent": "tx_cnp_pkts",
    "cnp_handled": "rx_cnp_pkts",
    "out_of_sequence": "oos_drop_count",
    "sequence_naks": "seq_err_naks_rcvd",
    "timeouts": "to_retransmits",
    "discards": "rx_roce_discards",
}


def _scrape(root: Path) -> dict[tuple[str, str, str], Reading]:
    collector = InfinibandCollector(CollectorContext("node-001", root))
    try:
        return {(r.device, r.port, r.counter): r for r in collector.scrape()}
    finally:
        collector.close()


def test_the_bnxt_re_table_reads_the_kernels_names_as_neutral_readings() -> None:
    got = _scrape(CASE / "sys")
    ecn = got[("bnxt_re0", "1", "rx_ecn_marked_pkts")]
    assert (ecn.name, ecn.unit, ecn.kind, ecn.width, ecn.saturates) == (
        "rx_ecn_marked_roce_packets",
        "packets",
        Kind.COUNTER,
        64,
        False,
    )
    assert ecn.value == 7412933
    qps = got[("bnxt_re0", "1", "active_qps")]
    assert (qps.name, qps.kind, qps.width, qps.value) == ("active_qps", Kind.GAUGE, 0, 129.0)
    assert got[("bnxt_re0", "1", "to_retransmits")].name == "local_ack_timeouts"  # mlx5's local_ack_timeout_err
    files = {p.name for p in HW.iterdir()}
    attributes = {"state", "phys_state", "rate", "port_info", "info"}
    # Every hw_counters file but the cache time, and nothing else (no counters/ on bnxt_re).
    assert {c for _, _, c in got} - attributes == files - {"lifespan"}


def test_bnxt_re_exports_gauges_as_gauges_and_shares_families_with_mlx5() -> None:
    samples = [Sample(T0, r) for r in _scrape(CASE / "sys").values()]
    text = render(samples, "node-001").decode()
    assert "# TYPE fabricd_infiniband_active_qps gauge" in text
    assert 'fabricd_infiniband_active_qps{device="bnxt_re0",node="node-001",port="1"} 129.0' in text
    assert "fabricd_infiniband_active_qps_total" not in text
    # The family an mlx5 port's np_ecn_marked_roce_packets is exported under.
    assert 'fabricd_infiniband_rx_ecn_marked_roce_packets_total{device="bnxt_re0",node="node-001",port="1"}' in text


def _mlx5_tree(root: Path, k: int) -> None:
    counters = {"port_rcv_packets": PER_INTERVAL["received"] * k, "port_xmit_discards": PER_INTERVAL["discards"] * k}
    counters |= {"symbol_error": 0, "port_rcv_errors": 0, "link_downed": 1, "port_xmit_wait": 5000}
    hw = {raw: PER_INTERVAL[what] * k for what, raw in MLX5_NAMES.items()} | {"lifespan": 10}
    port = PortTree(link_layer="Ethernet", rate="200 Gb/sec (2X NDR)", counters=counters, hw_counters=hw)
    write_infiniband_tree(root, {"mlx5_0": DeviceTree(ports={"1": port})})


def _bnxt_tree(root: Path, k: int) -> None:
    for what, raw in BNXT_NAMES.items():  # the case tree, its counters moved by k intervals of traffic
        start = int((HW / raw).read_text())
        (root / "class/infiniband/bnxt_re0/ports/1/hw_counters" / raw).write_text(f"{start + PER_INTERVAL[what] * k}\n")


def _samples(root: Path, write: Callable[[Path, int], None]) -> list[list[Sample]]:
    collector = InfinibandCollector(CollectorContext("x", root))
    engine, rounds = RateEngine(), []
    try:
        for k in range(ROUNDS):
            write(root, k)
            rounds.append(engine.update(T0 + k * STEP, collector.scrape()))
    finally:
        collector.close()
    return rounds


Seen = dict[tuple[str, str, Labels], list[float]]


def _signals(rounds: dict[str, list[list[Sample]]]) -> dict[str, Seen]:
    """The signals the engine's signal stage computes from every node's rounds, per node."""
    seen: dict[str, Seen] = {node: {} for node in rounds}

    def emit(signal: str, node: str, device: str, port: str, labels: Labels, ts: float, value: float) -> None:
        seen[node].setdefault((signal, port, labels), []).append(value)

    engine = DetectionEngine()
    engine.extractor = Extractor(emit)  # the signal stage, its output kept instead of ruled on
    _feed(engine, rounds)
    return seen


def _feed(engine: DetectionEngine, rounds: dict[str, list[list[Sample]]]) -> None:
    for k in range(ROUNDS):
        engine.process([(node, s) for node, node_rounds in rounds.items() for s in node_rounds[k]])


def test_a_bnxt_re_port_feeds_the_same_detectors_as_an_mlx5_port(tmp_path: Path) -> None:
    shutil.copytree(CASE / "sys", tmp_path / "bnxt")
    rounds = {
        "node-mlx5": _samples(tmp_path / "mlx5", _mlx5_tree),
        "node-bnxt": _samples(tmp_path / "bnxt", _bnxt_tree),
    }
    seen = _signals(rounds)
    mlx5, bnxt = seen["node-mlx5"], seen["node-bnxt"]
    # mlx5's PMA (counters/) gives what bnxt_re has no folder for; every other signal is the same number.
    only_pma = {(s, "1", ()) for s in ("phy_errors_per_second", "link_downs_per_second", "xmit_wait_ratio")}
    assert set(mlx5) - set(bnxt) == only_pma
    assert {k: v for k, v in mlx5.items() if k in bnxt} == bnxt
    per_second = {what: n / STEP for what, n in PER_INTERVAL.items()}
    intervals = ROUNDS - 1
    assert bnxt[("ecn_marked_ratio", "1", ())] == [pytest.approx(0.12)] * intervals
    assert bnxt[("sequence_errors_per_second", "1", ())] == [35.0] * intervals  # 20 + 15 per second
    assert bnxt[("retransmits_per_second", "1", ())] == [per_second["timeouts"]] * intervals
    assert bnxt[("cnp_sent_packets_per_second", "1", ())] == [per_second["cnp_sent"]] * intervals
    assert bnxt[("cnp_handled_packets_per_second", "1", ())] == [per_second["cnp_handled"]] * intervals
    assert bnxt[("discards_per_second", "1", ())] == [per_second["discards"]] * intervals
    engine = DetectionEngine()
    _feed(engine, rounds)
    firing = {(f.node, f.rule.name) for f in engine.tracker.firing(T0 + intervals * STEP)}
    rules = {"ecn_marked", "cnp_sent", "cnp_handled", "sequence_errors", "retransmits", "discards"}
    assert firing == {(node, rule) for node in rounds for rule in rules}


def test_detection_knows_no_driver_names() -> None:
    # Adding bnxt_re touched one table module and one case folder: detection reads neutral names only.
    from fabricd.drivers.ib import bnxt_re, mlx5

    raw = {c.raw for d in (bnxt_re.DRIVER, mlx5.DRIVER) for c in d.counters if c.raw != c.name}
    for path in sorted((REPO / "fabricd" / "detect").glob("*.py")):
        text = path.read_text()
        assert not [name for name in raw if f'"{name}"' in text], path.name
