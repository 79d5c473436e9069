"""Congestion: fired by marks/XmitWait/backlog, never by utilization; localized by the RTT pairs."""

from __future__ import annotations

from collections.abc import Mapping

from fabricd.detect import DetectionEngine
from fabricd.model import IncidentKind, IncidentState, Status
from fabricd.topology import fat_tree
from tests.support.series import Cluster, path_oracle, replay

SPINES = 2
TOPO = fat_tree(16, 2, 4, SPINES, "roce")
NODES = sorted(TOPO.nodes)
PEERS = {n: [NODES[(i + k) % 16] for k in (1, 4, 8, 12)] for i, n in enumerate(NODES)}
ORACLE = path_oracle(TOPO, SPINES)
FAULT = "leaf-02~spine-01"


def engine() -> DetectionEngine:
    e = DetectionEngine()
    e.set_topology(TOPO, ORACLE)
    return e


def crosses(src: str, dst: str) -> bool:
    return FAULT in ORACLE(src, dst)


def in_fault(ts: float, c: Cluster, first: int = 12, last: int = 30) -> bool:
    return first <= (ts - c.start) / c.interval < last


def test_congested_fabric_link_is_blamed_with_pairs_and_receivers() -> None:
    c = Cluster(NODES, hcas=2, probe_peers=PEERS)
    receivers = {dst for src in NODES for dst in PEERS[src] if crosses(src, dst)}

    def port(ts: float, node: str, hca: str) -> Mapping[str, float | None]:
        if in_fault(ts, c) and node in receivers and hca == "mlx5_0":
            return {"np_ecn_marked_roce_packets": 0.12 * 0.6 * 50e9 / 4096}
        return {}

    def pairs(ts: float, src: str, dst: str) -> tuple[float, float]:
        return (0.0, 450e-6 if in_fault(ts, c) and crosses(src, dst) else 20e-6)

    changes = replay(engine(), c.rounds(50, port=port, pairs=pairs))
    opened = [i for i in changes if i.state is IncidentState.OPEN]
    assert {i.key for i in opened} == {f"congestion:{FAULT}"}
    inc = opened[0]
    assert inc.element == FAULT and inc.candidates[0].element == FAULT
    assert inc.started_ts == c.start + 12 * c.interval  # the first firing sample, not the for-expiry
    assert "ecn_marked_ratio" in {e.signal for e in inc.evidence}
    assert inc.summary.startswith(f"{FAULT} is congested since ")
    assert changes[-1].state is IncidentState.RESOLVED


def test_busy_healthy_link_raises_nothing() -> None:
    c = Cluster(NODES, hcas=2, probe_peers=PEERS)

    def port(ts: float, node: str, hca: str) -> Mapping[str, float | None]:
        data = 0.97 * 50e9  # 97 % of 400 Gb/s, a trickle of marks, a little XmitWait: busy, not congested
        return {
            "port_xmit_data": data,
            "port_rcv_data": data,
            "np_ecn_marked_roce_packets": data / 4096 * 0.002,
            "port_xmit_wait": 0.01 * 50e9 / 8,
        }

    assert replay(engine(), c.rounds(40, port=port)) == []


def test_burst_shorter_than_for_raises_nothing() -> None:
    c = Cluster(NODES, hcas=2)

    def port(ts: float, node: str, hca: str) -> Mapping[str, float | None]:
        burst = in_fault(ts, c, 10, 11) and node == "node-005"  # one scrape: 10 s < for 10 s + 1 sample
        return {"np_ecn_marked_roce_packets": 0.5 * 0.6 * 50e9 / 4096} if burst else {}

    assert replay(engine(), c.rounds(30, port=port)) == []


def test_saturated_counter_never_raises() -> None:
    c = Cluster(NODES, hcas=2)

    def port(ts: float, node: str, hca: str) -> Mapping[str, float | None]:
        # port_xmit_wait pinned at all ones: no rate (the series builder marks it SATURATED).
        return {"port_xmit_wait": None} if node == "node-003" else {}

    batches = list(c.rounds(30, port=port))
    saturated = [s for _, s in batches[5] if s.reading.counter == "port_xmit_wait" and s.rate is None]
    assert saturated and all(s.status is Status.SATURATED for s in saturated)
    assert replay(engine(), batches) == []


def test_xmit_wait_on_one_port_blames_its_host_link() -> None:
    c = Cluster(NODES, hcas=2)

    def port(ts: float, node: str, hca: str) -> Mapping[str, float | None]:
        hot = in_fault(ts, c) and node == "node-009" and hca == "mlx5_1"
        return {"port_xmit_wait": 0.3 * 50e9 / 8, "np_ecn_marked_roce_packets": 0.2 * 0.6 * 50e9 / 4096} if hot else {}

    opened = [i for i in replay(engine(), c.rounds(40, port=port)) if i.state is IncidentState.OPEN]
    assert [(i.kind, i.element) for i in opened] == [(IncidentKind.CONGESTION, "node-009/mlx5_1~leaf-03")]
    assert opened[0].severity.value == "critical"  # 30 % of the link lost to XmitWait


def test_without_pairs_marks_spread_over_leaves_blame_the_leaf_with_its_uplinks_as_candidates() -> None:
    c = Cluster(NODES, hcas=2)
    receivers = {"node-005", "node-006", "node-007", "node-010"}  # three behind leaf-02, one elsewhere

    def port(ts: float, node: str, hca: str) -> Mapping[str, float | None]:
        hot = in_fault(ts, c) and node in receivers and hca == "mlx5_0"
        return {"np_ecn_marked_roce_packets": 0.08 * 0.6 * 50e9 / 4096} if hot else {}

    opened = [i for i in replay(engine(), c.rounds(40, port=port)) if i.state is IncidentState.OPEN]
    assert [(i.kind, i.element) for i in opened] == [(IncidentKind.CONGESTION, "leaf-02")]
    assert {"leaf-02~spine-01", "leaf-02~spine-02"} <= {x.element for x in opened[0].candidates}
    assert set(opened[0].affected) == receivers


def test_ib_congestion_with_xmit_wait_saturated_is_found_by_the_slow_pairs_through_the_link() -> None:
    # InfiniBand: no ECN, and the senders' 32-bit port_xmit_wait is pinned at all ones (no rate).
    # The pairs crossing the congested link are what is left, and they are enough.
    topo = fat_tree(16, 2, 4, SPINES, "infiniband")
    e = DetectionEngine()
    e.set_topology(topo, path_oracle(topo, SPINES))
    c = Cluster(NODES, hcas=2, probe_peers=PEERS)

    def port(ts: float, node: str, hca: str) -> Mapping[str, float | None]:
        return {"np_ecn_marked_roce_packets": 0.0, "port_xmit_wait": None if in_fault(ts, c) else 0.005 * 50e9 / 8}

    def pairs(ts: float, src: str, dst: str) -> tuple[float, float]:
        return (0.0, 260e-6 if in_fault(ts, c) and crosses(src, dst) else 20e-6)

    changes = replay(e, c.rounds(50, port=port, pairs=pairs))
    opened = [i for i in changes if i.state is IncidentState.OPEN]
    assert {(i.kind, i.element) for i in opened} == {(IncidentKind.CONGESTION, FAULT)}  # not tail latency
    assert opened[0].started_ts == c.start + 12 * c.interval
    assert {e.signal for e in opened[0].evidence} == {"rtt_p99_outlier"}
    assert "xmit_wait" not in " ".join(e.note for e in opened[-1].evidence)  # the saturated counter said nothing


def test_a_few_slow_pairs_with_nothing_in_common_are_not_congestion() -> None:
    c = Cluster(NODES, hcas=2, probe_peers=PEERS)
    slow = {("node-001", "node-005"), ("node-010", "node-014")}  # two unrelated pairs, no counters

    def pairs(ts: float, src: str, dst: str) -> tuple[float, float]:
        return (0.0, 400e-6 if in_fault(ts, c) and (src, dst) in slow else 20e-6)

    assert [i for i in replay(engine(), c.rounds(50, pairs=pairs)) if i.kind is IncidentKind.CONGESTION] == []
