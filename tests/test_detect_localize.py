"""Localization on a fat tree: the smallest element that explains the bad pairs and spares the good."""

from __future__ import annotations

import itertools

from fabricd.detect.localize import Localizer
from fabricd.topology import fat_tree
from tests.support.series import path_oracle

SPINES = 4
TOPO = fat_tree(32, 2, 8, SPINES, "roce")
NODES = sorted(TOPO.nodes)
PAIRS = [(a, b) for a, b in itertools.permutations(NODES, 2) if (int(a[-3:]) * 7 + int(b[-3:])) % 5 == 0]


def explain(loc: Localizer, bad: set[tuple[str, str]]) -> list[str]:
    symptoms = [loc.pair_symptom(p, *p) for p in PAIRS if p in bad]
    healthy = [loc.pair_symptom(p, *p) for p in PAIRS if p not in bad]
    return [c.element for c in loc.explain(symptoms, healthy)]


def test_bad_pairs_through_one_uplink_blame_that_uplink() -> None:
    oracle = path_oracle(TOPO, SPINES)
    loc = Localizer(TOPO, oracle)
    bad = {p for p in PAIRS if "leaf-02~spine-03" in oracle(*p)}
    assert len(bad) >= 5
    assert explain(loc, bad) == ["leaf-02~spine-03"]


def test_bad_pairs_of_one_node_blame_its_host_link_not_the_switch() -> None:
    oracle = path_oracle(TOPO, SPINES)
    loc = Localizer(TOPO, oracle)
    bad = {p for p in PAIRS if "node-011" in p}
    (element,) = explain(loc, bad)
    assert element in {"node-011/mlx5_0~leaf-02", "node-011/mlx5_0"}  # the port and its cable


def test_two_faults_give_two_clusters() -> None:
    oracle = path_oracle(TOPO, SPINES)
    loc = Localizer(TOPO, oracle)
    bad = {p for p in PAIRS if "leaf-01~spine-02" in oracle(*p) or "leaf-04~spine-04" in oracle(*p)}
    assert sorted(explain(loc, bad)) == ["leaf-01~spine-02", "leaf-04~spine-04"]


def test_without_paths_the_leaf_uplinks_share_the_blame() -> None:
    oracle = path_oracle(TOPO, SPINES)
    loc = Localizer(TOPO)  # no path oracle: every ECMP alternative is a candidate
    bad = {p for p in PAIRS if "leaf-02~spine-03" in oracle(*p)}
    symptoms = [loc.pair_symptom(p, *p) for p in PAIRS if p in bad]
    top = loc.explain(symptoms, [loc.pair_symptom(p, *p) for p in PAIRS if p not in bad])[0].candidates
    assert "leaf-02~spine-03" in {c.element for c in top}


def test_port_symptom_names_the_port_its_link_and_node() -> None:
    loc = Localizer(TOPO)
    (alt,) = loc.port_symptom(None, "node-005/mlx5_1").alternatives
    assert alt == {"node-005/mlx5_1", "node-005/mlx5_1~leaf-01", "node-005"}
