"""Element kinds come from the topology, never from the shape of a name (issue 15 §7).

A host called ``gpu-a17`` or ``dgx-h100-017`` is a host and a switch called ``ib-leaf-3`` or ``sp2``
a switch because the topology says so. The simulator names them the way sites do
(``topology.names``), and a scenario so named behaves exactly like the same scenario under the
default names: the detectors see the same fabric, only relabeled.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fabricd.detect import DetectionEngine
from fabricd.detect.localize import Localizer
from fabricd.model import IncidentKind, IncidentState
from fabricd.sim import eval as ev
from fabricd.sim import scenario as sc
from fabricd.sim.fabric import build
from fabricd.topology import Element, ElementKind, Naming, fat_tree, from_doc, to_doc
from tests.support.series import Cluster, path_oracle, replay

SITE = Naming(node="gpu-a{}", leaf="ib-leaf-{}", spine="sp{}")  # "sp1": a switch with no dash
TOPO = fat_tree(20, 2, 5, 2, "roce", names=SITE)


def test_the_topology_classes_site_names_by_what_they_are() -> None:
    assert TOPO.element("gpu-a17") == Element("gpu-a17", ElementKind.NODE, "gpu-a17")
    assert TOPO.element("gpu-a17/mlx5_1") == Element("gpu-a17/mlx5_1", ElementKind.HCA, "gpu-a17", "mlx5_1")
    assert TOPO.element("ib-leaf-3") == Element("ib-leaf-3", ElementKind.SWITCH)
    assert TOPO.element("sp2") == Element("sp2", ElementKind.SWITCH)
    assert TOPO.element("ib-leaf-4~sp2") == Element("ib-leaf-4~sp2", ElementKind.FABRIC_LINK, ends=("ib-leaf-4", "sp2"))
    assert TOPO.element("gpu-a17/mlx5_1~ib-leaf-4") == Element(
        "gpu-a17/mlx5_1~ib-leaf-4", ElementKind.HOST_LINK, "gpu-a17", ends=("gpu-a17/mlx5_1", "ib-leaf-4")
    )
    assert TOPO.element("node-001") is None  # not in this fabric, whatever its name looks like


def test_kinds_survive_the_api_document() -> None:
    doc = to_doc(fat_tree(4, 1, 2, 1, names=Naming(node="dgx-h100-{:03d}", leaf="leaf{}", spine="core-{}")))
    topo = from_doc(doc)
    kinds = {e: topo.element(e).kind for e in ("dgx-h100-003", "dgx-h100-003/mlx5_0", "leaf2", "core-1")}  # type: ignore[union-attr]
    assert kinds == {
        "dgx-h100-003": ElementKind.NODE,
        "dgx-h100-003/mlx5_0": ElementKind.HCA,
        "leaf2": ElementKind.SWITCH,
        "core-1": ElementKind.SWITCH,
    }


def test_a_name_used_for_a_host_and_a_switch_is_refused() -> None:
    doc = {
        "elements": [
            {"id": "gpu-a1", "type": "switch", "tier": "leaf"},
            {"id": "gpu-a1/mlx5_0", "type": "hca_port", "node": "gpu-a1", "device": "mlx5_0"},
        ],
        "links": [],
    }
    with pytest.raises(ValueError, match=r"^elements\[1\]: element 'gpu-a1' is both a host and a switch$"):
        from_doc(doc)


def test_the_localizer_resolves_kinds_and_hosts_from_the_topology() -> None:
    loc = Localizer(TOPO, path_oracle(TOPO, 2))
    assert [loc.kind(e) for e in ("gpu-a17", "gpu-a17/mlx5_0", "ib-leaf-3", "sp1", "ib-leaf-1~sp1", "nope")] == [
        ElementKind.NODE,
        ElementKind.HCA,
        ElementKind.SWITCH,
        ElementKind.SWITCH,
        ElementKind.FABRIC_LINK,
        None,
    ]
    assert [loc.node_of(e) for e in ("gpu-a17", "gpu-a17/mlx5_0", "gpu-a17/mlx5_0~ib-leaf-4", "ib-leaf-4")] == [
        "gpu-a17",
        "gpu-a17",
        "gpu-a17",
        None,
    ]
    # A traced path given as links crosses the elements at their ends and their hosts.
    (alt,) = loc.pair_paths("gpu-a1", "gpu-a2")
    assert alt == {
        "gpu-a1",
        "gpu-a2",
        "gpu-a1/mlx5_0",
        "gpu-a2/mlx5_0",
        "gpu-a1/mlx5_0~ib-leaf-1",
        "gpu-a2/mlx5_0~ib-leaf-1",
        "ib-leaf-1",
    }


def test_without_a_topology_the_localizer_knows_what_it_was_handed() -> None:
    loc = Localizer()
    hca = loc.hca("dgx-h100-017", "mlx5_3")
    loc.pair_symptom(None, "dgx-h100-017", "ib-leaf-3-bmc")
    assert (loc.kind(hca), loc.node_of(hca)) == (ElementKind.HCA, "dgx-h100-017")
    assert (loc.kind("ib-leaf-3-bmc"), loc.kind("dgx-h100-017")) == (ElementKind.NODE, ElementKind.NODE)
    assert loc.kind("ib-leaf-3") is None  # never seen: unknown, not guessed


def _slow_host_run(names: Naming, slow: str) -> tuple[Localizer, set[tuple[IncidentKind, str]]]:
    """Pairs through one host turn slow with clean counters: tail latency on that host, whatever
    its name (a name-shape guess took ``gpu-a10`` for a switch: a queue, so congestion)."""
    topo = fat_tree(16, 2, 4, 2, "roce", names=names)
    nodes = list(topo.nodes)  # in the order fat_tree numbered them
    peers = {n: [nodes[(i + k) % 16] for k in (1, 4, 8, 12)] for i, n in enumerate(nodes)}
    c = Cluster(nodes, hcas=2, probe_peers=peers)

    def pairs(ts: float, src: str, dst: str) -> tuple[float, float]:
        k = int((ts - c.start) // c.interval)
        if slow in (src, dst) and 12 <= k < 30:
            return (0.0, 300e-6)
        return (0.0, 20e-6 + (k % 2) * 1e-6)

    e = DetectionEngine()
    e.set_topology(topo, path_oracle(topo, 2))
    opened = {(i.kind, i.element) for i in replay(e, c.rounds(40, pairs=pairs)) if i.state is IncidentState.OPEN}
    return Localizer(topo), opened


@pytest.mark.parametrize(
    ("names", "slow"),
    [(Naming(), "node-010"), (Naming(node="gpu-a{}", leaf="ib-leaf-{}", spine="sp{}"), "gpu-a10")],
)
def test_a_slow_host_is_tail_latency_on_that_host_under_any_names(names: Naming, slow: str) -> None:
    loc, opened = _slow_host_run(names, slow)
    assert {kind for kind, _ in opened} == {IncidentKind.TAIL_LATENCY}
    assert {(loc.node_of(element), loc.kind(element) in HOST_SIDE) for _, element in opened} == {(slow, True)}


HOST_SIDE = {ElementKind.NODE, ElementKind.HCA, ElementKind.HOST_LINK}


# --- the simulator's ``topology.names`` ------------------------------------------------------------


def _scenario(names: dict[str, str] | None, at: str) -> sc.Scenario:
    topology: dict[str, object] = {"nodes": 8, "hcas_per_node": 1, "nodes_per_leaf": 4, "spines": 2}
    if names is not None:
        topology["names"] = names
    return sc.parse(
        {
            "name": "named",
            "duration": "2m",
            "interval": "10s",
            "topology": topology,
            "faults": [{"kind": "congestion", "at": at, "start": "30s", "end": "90s"}],
        }
    )


def test_a_scenario_names_its_hosts_and_switches() -> None:
    s = _scenario({"node": "dgx-h100-{:03d}", "leaf": "ib-leaf-{}", "spine": "ib-spine-{}"}, "ib-leaf-2~ib-spine-1")
    topo = s.build_topology()
    assert sorted(topo.nodes) == [f"dgx-h100-{n:03d}" for n in range(1, 9)]
    assert sorted(topo.switches) == ["ib-leaf-1", "ib-leaf-2", "ib-spine-1", "ib-spine-2"]


@pytest.mark.parametrize(
    ("names", "at", "message"),
    [
        (
            {"node": "gpu"},
            "leaf-01~spine-01",
            "topology.names: Value error, node: 'gpu' gives every node the same name",
        ),
        ({"leaf": "leaf-{x}"}, "leaf-01~spine-01", "topology.names: Value error, leaf: 'leaf-{x}' is not a template"),
        ({"node": "gpu/{}"}, "leaf-01~spine-01", "topology.names: Value error, node: 'gpu/{}' makes 'gpu/1'"),
        ({"node": "sw{}", "spine": "sw{}"}, "leaf-01~sw1", "topology.names: names: sw1, sw2 named twice"),
        ({"leaf": "ib-leaf-{}"}, "leaf-01~spine-01", "faults[0].at: 'leaf-01~spine-01' is not a link"),
    ],
)
def test_names_that_cannot_work_are_refused_with_the_key(names: dict[str, str], at: str, message: str) -> None:
    with pytest.raises(sc.ScenarioError) as exc:
        _scenario(names, at)
    assert str(exc.value).startswith(f"<scenario>: {message}")


DETECTION_SCORES = ("recall", "precision", "localization_top1", "on_time", "false_positives")


def _incidents(scenario: sc.Scenario, tmp: Path) -> set[tuple[str, str, float]]:
    run = asyncio.run(ev.replay(scenario, tmp))
    return {(inc.kind.value, inc.element, first) for first, inc in run.seen.values()}


@pytest.mark.parametrize("name", ["link-flap-ib", "straggler-roce"])
def test_a_shipped_scenario_with_site_names_scores_perfectly_and_relabels_exactly(name: str, tmp_path: Path) -> None:
    named = sc.load(name)
    assert named.topology.names != sc.NamesSpec()  # it ships with site names
    result = ev.evaluate(named)
    scores = {k: v for k, v in result.metrics().items() if k in DETECTION_SCORES}
    assert scores == {
        "recall": 1.0,
        "precision": 1.0,
        "localization_top1": 1.0,
        "on_time": 1.0,
        "false_positives": 0,
    }
    (fault,) = result.faults
    topo = named.build_topology()
    kind = topo.element(fault.element).kind  # type: ignore[union-attr]
    assert kind == {"link-flap-ib": ElementKind.HOST_LINK, "straggler-roce": ElementKind.NODE}[name]
    # The same scenario under the default names opens the same incidents at the same moments.
    canonical = build(named).canonical
    plain = named.model_copy(update={"topology": named.topology.model_copy(update={"names": sc.NamesSpec()})})
    plain = plain.model_copy(update={"faults": [f.model_copy(update={"at": canonical[f.at]}) for f in named.faults]})
    (tmp_path / "named").mkdir()
    (tmp_path / "plain").mkdir()
    relabeled = {(k, canonical[e], ts) for k, e, ts in _incidents(named, tmp_path / "named")}
    assert relabeled == _incidents(plain, tmp_path / "plain")
