"""Tail latency against robust baselines, and stragglers told apart from network trouble."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import pairwise

from fabricd.detect import DetectionEngine
from fabricd.detect.latency import BaselineParams, Baselines
from fabricd.model import IncidentKind, IncidentState, Sample
from fabricd.topology import fat_tree
from tests.support.series import Cluster, nccl_run, path_oracle, replay

TOPO = fat_tree(16, 2, 4, 2, "roce")
NODES = sorted(TOPO.nodes)
PEERS = {n: [NODES[(i + k) % 16] for k in (1, 4, 8, 12)] for i, n in enumerate(NODES)}
ORACLE = path_oracle(TOPO, 2)


def engine() -> DetectionEngine:
    e = DetectionEngine()
    e.set_topology(TOPO, ORACLE)
    return e


def step(ts: float, c: Cluster) -> int:
    return int((ts - c.start) // c.interval)


def test_baseline_is_robust_to_the_outliers_it_must_expose() -> None:
    b = Baselines(BaselineParams(history=20, min_history=5, refresh_every=1))
    for i in range(20):
        b.score(("rtt",), ("a", "b"), float(i), 20e-6 + (i % 3) * 1e-6)
    spike, _ = b.score(("rtt",), ("a", "b"), 20.0, 200e-6)
    assert spike > 6
    for i in range(21, 30):  # a sustained fault does not become the new normal
        b.score(("rtt",), ("a", "b"), float(i), 200e-6)
    baseline = b.series_median(("a", "b"))
    assert baseline is not None and baseline < 25e-6


def test_a_straggler_stays_an_outlier_on_a_small_fleet_while_its_partners_take_turns() -> None:
    # A 4-node random variant: node-2 turns 2x slow, and each round one partner runs with it and is
    # as slow (a collective is as slow as its slowest member). Against the members' latest runs,
    # half the fleet was slow at once: node-2 scored 9 on its first slow run and 0.7 on the next.
    b = Baselines(BaselineParams(min_history=3))
    group = ("all_reduce", "4294967296")
    scores: dict[str, list[float]] = {}
    for k in range(12):
        partner = ("node-1", "node-3", "node-4")[k % 3]
        for n in ("node-1", "node-2", "node-3", "node-4"):
            slow = k >= 6 and n in ("node-2", partner)
            t = (0.085 if slow else 0.0446) * (1 + 0.002 * ((k + len(n)) % 3))
            scores.setdefault(n, []).append(b.score(group, (n, *group), 100.0 + 5 * k + 0.1 * int(n[-1]), t)[1])
    assert all(z > 4 for z in scores["node-2"][6:]), scores["node-2"]
    # each partner is slow in one run of three: never twice in a row, so "for" keeps it out
    for n in ("node-1", "node-3", "node-4"):
        slow_runs = [k for k, z in enumerate(scores[n]) if z > 4]
        assert all(b - a > 1 for a, b in pairwise(slow_runs)), (n, scores[n])


def test_sustained_p99_rise_on_pairs_through_one_node_is_a_tail_latency_incident_with_hysteresis() -> None:
    c = Cluster(NODES, hcas=2, probe_peers=PEERS)

    def pairs(ts: float, src: str, dst: str) -> tuple[float, float]:
        k = step(ts, c)
        if "node-010" in (src, dst) and 12 <= k < 30:
            # Rises well above baseline, then hovers at 2x (between clear and fire levels) for a while.
            return (0.0, 300e-6 if k < 20 else 32e-6)
        return (0.0, 20e-6 + (k % 2) * 1e-6)

    changes = replay(engine(), c.rounds(50, pairs=pairs))
    opened = [i for i in changes if i.state is IncidentState.OPEN]
    assert {i.kind for i in opened} == {IncidentKind.TAIL_LATENCY}
    assert opened[0].element.startswith("node-010")
    resolved = [i for i in changes if i.state is IncidentState.RESOLVED]
    assert len(resolved) == 1  # no flapping while the p99 hovers above the clear level


def test_single_slow_node_with_clean_counters_is_a_straggler() -> None:
    c = Cluster(NODES, hcas=2, nccl=True)

    def nccl(ts: float, node: str) -> float:
        return 0.0175 if node == "node-004" and 10 <= step(ts, c) < 30 else 0.010 * (1 + 0.01 * (step(ts, c) % 3))

    opened = [i for i in replay(engine(), c.rounds(50, nccl=nccl)) if i.state is IncidentState.OPEN]
    assert [(i.kind, i.element) for i in opened] == [(IncidentKind.STRAGGLER, "node-004")]
    assert opened[0].candidates[0].element == "node-004"


def test_slow_node_with_dirty_counters_is_the_network_not_a_straggler() -> None:
    c = Cluster(NODES, hcas=2, nccl=True)

    def nccl(ts: float, node: str) -> float:
        return 0.0175 if node == "node-004" and 10 <= step(ts, c) < 30 else 0.010

    def port(ts: float, node: str, hca: str) -> Mapping[str, float | None]:
        return {"symbol_error": 3.0} if node == "node-004" and hca == "mlx5_1" and 10 <= step(ts, c) < 30 else {}

    opened = [i for i in replay(engine(), c.rounds(50, port=port, nccl=nccl)) if i.state is IncidentState.OPEN]
    assert [(i.kind, i.element) for i in opened] == [(IncidentKind.PACKET_LOSS, "node-004/mlx5_1~leaf-01")]


def test_many_nodes_slow_at_once_is_not_a_set_of_stragglers() -> None:
    c = Cluster(NODES, hcas=2, nccl=True)
    slow = set(NODES[:5])

    def nccl(ts: float, node: str) -> float:
        return 0.02 if node in slow and 10 <= step(ts, c) < 30 else 0.010

    assert [i for i in replay(engine(), c.rounds(50, nccl=nccl)) if i.kind is IncidentKind.STRAGGLER] == []


# --- who ran with whom: stragglers told from the victims of a fault between partners ---------------

JOB = [n for n in NODES if n not in ("node-013", "node-014")]  # the nodes running NCCL-tests


def _partner(k: int, node: str) -> str:
    """Each node runs its own two-node test every round, with the next partner in turn."""
    i = JOB.index(node)
    return JOB[(i + k % (len(JOB) - 1) + 1) % len(JOB)]


def _runs(c: Cluster, slow: Callable[[int, str, str], bool]) -> Callable[[float, str], list[Sample]]:
    """NCCL times and run hosts (the collector's ``run_host_info``) of every node in ``JOB``."""

    def samples(ts: float, node: str) -> list[Sample]:
        if node not in JOB:
            return []
        k = step(ts, c)
        partner = _partner(k, node)
        seconds = (0.0175 if slow(k, node, partner) else 0.010) * (1 + 0.01 * (k % 3))
        return nccl_run(ts, seconds, (node, partner))

    return samples


def test_a_straggler_slow_with_every_partner_in_turn_is_reported_within_two_runs() -> None:
    c = Cluster(NODES, hcas=2)
    changes = replay(engine(), c.rounds(50, extra=_runs(c, lambda k, n, p: 10 <= k < 40 and "node-004" in (n, p))))
    opened = [i for i in changes if i.state is IncidentState.OPEN]
    assert [(i.kind, i.element) for i in opened] == [(IncidentKind.STRAGGLER, "node-004")]
    assert (opened[0].updated_ts - c.start) / c.interval <= 12  # slow from round 10: opened by 12


def test_two_nodes_slow_with_every_partner_but_each_other_are_no_stragglers() -> None:
    # node-015 and node-016 share a leaf and cross a congested uplink (no probe shows) to everyone
    # else: slow with every partner but fast together, and a node meeting them in two rounds in a
    # row is slow twice. Before, node-012 (just before them in turn) and node-016 opened
    # ``straggler``, though each victim's partners were slow in runs without it too
    # (fabricd/detect/latency.py, ``_partners_slow_elsewhere``).
    victims = {"node-015", "node-016"}
    c = Cluster(NODES, hcas=2)
    changes = replay(
        engine(), c.rounds(50, extra=_runs(c, lambda k, n, p: 10 <= k < 40 and len({n, p} & victims) == 1))
    )
    assert [(i.kind, i.element) for i in changes if i.state is IncidentState.OPEN] == []
