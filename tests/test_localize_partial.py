"""Localization with partial knowledge (issue 16 §5): traced paths count whole, ECMP alternatives
split the weight, and a fault the evidence cannot place on one element is reported as ambiguous
among the candidates it cannot tell apart, each with its weight (docs/detection.md)."""

from __future__ import annotations

from collections.abc import Callable

from fabricd.detect.localize import Cluster, Localizer, Symptom
from fabricd.model import Candidate
from fabricd.topology import Topology, fat_tree

Hash = Callable[[int, int, int], int]  # (src index, dst index, alternatives) -> the one taken


def spread(i: int, j: int, n: int) -> int:
    """A fixed stand-in for the switches' ECMP hash: every pair takes one alternative, all are used."""
    return (7 * i + 3 * j) % n


def probed(topo: Topology, fault: str, known: Callable[[str, str], bool] = lambda a, b: True) -> Cluster | None:
    """Every ordered node pair probed; a pair is bad when the path its packets take crosses
    ``fault``. ``known(src, dst)``: whether its path is traced (else only its ECMP alternatives)."""
    names = sorted(topo.nodes)
    taken = {}
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if a != b:
                alts = sorted(topo.paths(a, b), key=sorted)
                taken[(a, b)] = alts[spread(i, j, len(alts))]
    loc = Localizer(topo, lambda a, b: sorted(taken[(a, b)]) if known(a, b) else None)
    bad: list[Symptom] = []
    good: list[Symptom] = []
    for (a, b), path in taken.items():
        (bad if fault in path else good).append(loc.pair_symptom((a, b), a, b))
    clusters = loc.explain(bad, good)
    assert len(clusters) <= 1, clusters
    return clusters[0] if clusters else None


def summary(c: Cluster | None) -> tuple[str, bool, str, list[Candidate], float]:
    assert c is not None
    return c.element, c.ambiguous, c.subject, c.candidates, round(c.consistency, 4)


THREE_LEAVES = fat_tree(12, 1, 4, 4, "roce")  # leaf-01..03, 4 hosts each, 4 spines
TWO_LEAVES = fat_tree(8, 1, 4, 2, "roce")  # the routed lab's shape: 2 leaves, 2 spines, 4 hosts each


def test_without_traced_paths_a_leaf_uplink_fault_is_one_of_the_leafs_uplinks_each_a_quarter() -> None:
    uplinks = [f"leaf-02~spine-0{k}" for k in range(1, 5)]
    assert summary(probed(THREE_LEAVES, "leaf-02~spine-01", known=lambda a, b: False)) == (
        "leaf-02",
        True,
        f"one of leaf-02's 4 uplinks ({', '.join(uplinks)})",
        [Candidate(u, 0.0625, 0.25) for u in uplinks],
        1.0,
    )


def test_with_traced_paths_the_same_fault_is_its_exact_link_with_the_whole_weight() -> None:
    c = probed(THREE_LEAVES, "leaf-02~spine-01")
    assert summary(c)[:3] == ("leaf-02~spine-01", False, "")
    assert summary(c)[3:] == (
        [
            Candidate("leaf-02~spine-01", 1.0, 1.0),
            Candidate("spine-01", 0.6667, 1.0),
            Candidate("leaf-01~spine-01", 0.25, 0.5),
            Candidate("leaf-03~spine-01", 0.25, 0.5),
            Candidate("leaf-02", 0.2105, 1.0),
        ],
        1.0,
    )


def test_half_the_pairs_traced_still_name_the_exact_link() -> None:
    # Traced pairs give the faulty link their whole weight and clear the other uplinks; the untraced
    # half splits its weight four ways: the faulty link stands out (more than twice the next).
    c = probed(THREE_LEAVES, "leaf-02~spine-01", known=lambda a, b: a < b)
    assert summary(c)[:3] == ("leaf-02~spine-01", False, "")


def test_two_leaves_untraced_cannot_tell_either_leafs_uplinks_apart() -> None:
    # Every pair crosses both leaves: the evidence is the same for all four fabric links.
    links = ["leaf-01~spine-01", "leaf-01~spine-02", "leaf-02~spine-01", "leaf-02~spine-02"]
    assert summary(probed(TWO_LEAVES, "leaf-01~spine-01", known=lambda a, b: False)) == (
        "leaf-01",
        True,
        f"one of 4 fabric links ({', '.join(links)})",
        [Candidate(link, 0.25, 0.25) for link in links],
        1.0,
    )


def test_two_leaves_traced_leave_the_two_links_of_one_spine_tied() -> None:
    # A packet that crosses leaf-01~spine-01 crosses leaf-02~spine-01 too: traced paths narrow it to
    # the spine's two links and no further, and the incident says so rather than pick by name.
    assert summary(probed(TWO_LEAVES, "leaf-01~spine-01")) == (
        "leaf-01~spine-01",
        True,
        "one of 2 fabric links (leaf-01~spine-01, leaf-02~spine-01)",
        [Candidate("leaf-01~spine-01", 1.0, 0.5), Candidate("leaf-02~spine-01", 1.0, 0.5)],
        1.0,
    )


def test_a_leaf_whose_own_pairs_are_bad_is_the_leaf_not_its_uplinks() -> None:
    # The leaf drops everything: pairs below it are bad too, which no uplink explains.
    c = probed(THREE_LEAVES, "leaf-02", known=lambda a, b: False)
    assert summary(c)[:3] == ("leaf-02", False, "")
    assert summary(c)[3][0] == Candidate("leaf-02", 1.0, 1.0)


def test_two_ports_with_marks_of_their_own_are_two_places_not_one_of_two() -> None:
    topo = fat_tree(16, 2, 4, 2, "roce")
    loc = Localizer(topo)
    marks = [loc.port_symptom(("marks", n), loc.hca(n, "mlx5_0")) for n in ("node-011", "node-016")]
    clusters = loc.explain(marks, [])
    assert [(c.element, c.ambiguous) for c in clusters] == [
        ("node-011/mlx5_0~leaf-03", False),
        ("node-016/mlx5_0~leaf-04", False),
    ]
