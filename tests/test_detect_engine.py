"""The engine runs on event time only: replays are deterministic, an hour replays in moments."""

from __future__ import annotations

import ast
import random
from collections.abc import Callable, Mapping
from pathlib import Path

from fabricd.detect import DetectionEngine
from fabricd.model import IncidentKind, IncidentState, Sample
from fabricd.topology import fat_tree
from tests.support.series import Cluster, counter, replay

TOPO = fat_tree(8, 2, 4, 2, "roce")
NODES = sorted(TOPO.nodes)
DETECT = Path(__file__).resolve().parent.parent / "fabricd" / "detect"


def faulty(c: Cluster) -> Callable[[float, str, str], Mapping[str, float | None]]:
    def port(ts: float, node: str, hca: str) -> Mapping[str, float | None]:
        k = int((ts - c.start) // c.interval)
        return {"symbol_error": 1.0} if node == "node-002" and hca == "mlx5_1" and 100 <= k < 200 else {}

    return port


def test_a_simulated_hour_gives_the_same_incidents_at_the_same_event_times_every_replay() -> None:
    runs = []
    for start in (1_700_000_000.0, 1_800_000_000.0):  # the epoch moves, nothing else does
        c = Cluster(NODES, hcas=2, start=start)
        e = DetectionEngine()
        e.set_topology(TOPO)
        runs.append(
            [
                (i.key, i.state, i.started_ts - start, i.updated_ts - start)
                for i in replay(e, c.rounds(360, port=faulty(c)))
            ]
        )
    assert runs[0] == runs[1]
    assert runs[0][0] == ("packet_loss:node-002/mlx5_1~leaf-01", IncidentState.OPEN, 1000.0, 1010.0)
    assert runs[0][-1][1] is IncidentState.RESOLVED


def test_the_detectors_never_read_the_wall_clock() -> None:
    for path in DETECT.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        attrs = {
            f"{n.value.id}.{n.attr}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
        }
        assert "time" not in names and not {"time.time", "time.monotonic", "datetime.now"} & attrs, path.name


def test_process_reports_only_state_changes() -> None:
    c = Cluster(NODES, hcas=2)
    e = DetectionEngine()
    e.set_topology(TOPO)
    per_call = [len(e.process(b)) for b in c.rounds(300, port=faulty(c))]
    assert sum(per_call) == 2  # opened once, resolved once, silent in between
    assert e.incidents() == []


def test_the_order_of_samples_within_a_scrape_round_changes_nothing() -> None:
    """``_absorb`` reuses the previous sample's record and scope while node, device, port and time
    stay the same (a scrape arrives grouped so): samples of many ports interleaved must give the
    same incidents as samples grouped by port."""
    c = Cluster(NODES, hcas=2)
    loss = faulty(c)

    def port(ts: float, node: str, hca: str) -> Mapping[str, float | None]:
        k = int((ts - c.start) // c.interval)
        marks = {"np_ecn_marked_roce_packets": 0.5 * 0.6 * 50e9 / 4096} if node == "node-005" and 30 <= k < 90 else {}
        return {**loss(ts, node, hca), **marks}

    def run(order: Callable[[list[tuple[str, Sample]]], list[tuple[str, Sample]]]) -> list[tuple[object, ...]]:
        e = DetectionEngine()
        e.set_topology(TOPO)
        changes = replay(e, (order(b) for b in Cluster(NODES, hcas=2).rounds(240, port=port)))
        return [(i.key, i.state, i.started_ts, i.updated_ts, i.severity) for i in changes]

    grouped = run(list)
    rng = random.Random(7)
    assert run(lambda b: rng.sample(b, len(b))) == grouped
    assert {k.split(":")[0] for k, *_ in grouped} == {"packet_loss", "congestion"}  # both faults seen
    # Two ports of one device, their samples alternating: each port's values stay its own.
    e = DetectionEngine()
    for k in range(12):
        ts = 1e9 + 10.0 * k
        moment = [
            counter(ts, "infiniband", "mlx5_0", metric, rate, port=port, name=metric)
            for metric in ("port_receive_data", "symbol_errors")
            for port, rate in (
                ("1", 1e9 if metric == "port_receive_data" else 0.0),
                ("2", 1e9 if metric == "port_receive_data" else 5.0),
            )
        ]
        e.process_moment([("node-001", x) for x in moment], ts)
    assert {(f.rule.name, f.port) for f in e.tracker.firing(1e9 + 110.0)} == {("phy_errors", "2")}


def test_sources_and_counters_it_does_not_use_are_ignored() -> None:
    e = DetectionEngine()
    noise = [("node-001", counter(1e9 + 10 * i, "derived", "mlx5_0", "ecn_marked_ratio", 0.9)) for i in range(20)]
    noise += [("node-001", counter(1e9 + 10 * i, "infiniband", "mlx5_0", "rx_write_requests", 1e9)) for i in range(20)]
    assert e.process(noise) == []
    assert {r.kind for r in e.rules.rules} == set(IncidentKind)
