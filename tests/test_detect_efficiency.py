"""Sustained NCCL-tests efficiency drops (measured / model busbw, ``fabricd.derived``) feed the
straggler detector, behind the same guards as slow NCCL times."""

from __future__ import annotations

from fabricd.detect import DetectionEngine
from fabricd.model import Incident, IncidentKind, IncidentState, Sample
from fabricd.topology import fat_tree
from tests.support.series import Cluster, gauge, path_oracle, replay

TOPO = fat_tree(16, 2, 4, 2, "roce")
NODES = sorted(TOPO.nodes)
HEALTHY = 0.93  # what the simulator's healthy runs score against the default model
SIZE = str(4 << 30)


def engine() -> DetectionEngine:
    e = DetectionEngine()
    e.set_topology(TOPO, path_oracle(TOPO, 2))
    return e


def run_efficiencies(c: Cluster, low: set[str], runs: range, value: float = 0.4) -> list[Incident]:
    """One NCCL-tests run per node per scrape round, as the agent derives it; ``low`` nodes score
    ``value`` in the rounds ``runs`` and every port stays clean."""

    def extra(ts: float, node: str) -> list[Sample]:
        k = int((ts - c.start) // c.interval)
        v = value if node in low and k in runs else HEALTHY
        return [gauge(ts, "derived", "all_reduce", "nccl_efficiency", v, labels={"size": SIZE}, name="nccl_efficiency")]

    return replay(engine(), c.rounds(30, extra=extra))


def opened(changes: list[Incident]) -> list[Incident]:
    return [i for i in changes if i.state is IncidentState.OPEN]


def test_three_low_runs_with_clean_counters_make_a_straggler() -> None:
    c = Cluster(NODES, hcas=2)
    found = opened(run_efficiencies(c, {"node-004"}, range(10, 13)))
    assert [(i.kind, i.element) for i in found] == [(IncidentKind.STRAGGLER, "node-004")]
    inc = found[0]
    assert inc.candidates[0].element == "node-004"
    # Sustained from the third low run (the signal is the best of the last three): event time only.
    assert inc.started_ts == c.start + 12 * c.interval
    assert [(e.signal, e.value) for e in inc.evidence] == [("nccl_efficiency_sustained", 0.4)]
    assert "nccl_efficiency_sustained at 40.0% on node-004" in inc.summary


def test_a_short_dip_is_nothing() -> None:
    # Two low runs: a healthy node paired with a slow one for a job or two.
    assert run_efficiencies(Cluster(NODES, hcas=2), {"node-004"}, range(10, 12)) == []


def test_a_fleet_wide_drop_is_a_shared_cause_not_stragglers() -> None:
    changes = run_efficiencies(Cluster(NODES, hcas=2), set(NODES), range(10, 25))
    assert [i for i in changes if i.kind is IncidentKind.STRAGGLER] == []


def test_three_slow_nodes_are_more_than_stragglers() -> None:
    changes = run_efficiencies(Cluster(NODES, hcas=2), set(NODES[:3]), range(10, 25))
    assert [i for i in changes if i.kind is IncidentKind.STRAGGLER] == []  # straggler_max_nodes: 2


def test_low_efficiency_and_slow_times_are_one_straggler() -> None:
    c = Cluster(NODES, hcas=2, nccl=True)

    def nccl(ts: float, node: str) -> float:
        k = int((ts - c.start) // c.interval)
        return 0.0175 if node == "node-004" and 10 <= k < 25 else 0.010

    def extra(ts: float, node: str) -> list[Sample]:
        k = int((ts - c.start) // c.interval)
        v = 0.45 if node == "node-004" and 10 <= k < 25 else HEALTHY
        return [gauge(ts, "derived", "all_reduce", "nccl_efficiency", v, labels={"size": SIZE}, name="nccl_efficiency")]

    found = opened(replay(engine(), c.rounds(30, nccl=nccl, extra=extra)))
    assert {(i.key, i.kind, i.element) for i in found} == {("straggler:node-004", IncidentKind.STRAGGLER, "node-004")}
    assert {e.signal for e in found[-1].evidence} == {"nccl_time_outlier", "nccl_efficiency_sustained"}
