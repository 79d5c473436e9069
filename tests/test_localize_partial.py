"""Localization with partial knowledge (issue 16 §5): traced paths count whole, ECMP alternatives
split the weight, and a fault the evidence cannot place on one element is reported as ambiguous
among the candidates it cannot tell apart, each with its weight (docs/detection.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from fabricd.detect.base import blind_spots
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


# --- round trips: a queue on one direction of a link (docs/detection.md, "Round trips") ----------

LAB = fat_tree(12, 1, 4, 2, "roce")  # the routed lab's shape: 3 leaves of 4 hosts, 2 spines
OUT_OF_LEAF_03 = "leaf-03~spine-01>spine-01"  # the leaf's egress towards spine-01: where the tbf sits


def _leaves(topo: Topology, path: frozenset[str], src: str) -> list[str]:
    """The switches a path visits, in order from ``src``'s leaf (a path here is up, over, down)."""
    first = topo.uplink(f"{src}/mlx5_0").b
    spines = sorted(e for e in path if e in topo.switches and topo.switches[e].tier == "spine")
    last = next(e for e in path if e in topo.switches and e != first and e not in spines) if spines else first
    return [first, *spines, last] if spines else [first]


def _leaves_egress(topo: Topology, path: frozenset[str], src: str, queue: str) -> bool:
    """Whether a packet on ``path`` from ``src`` leaves ``queue``'s leaf towards its spine."""
    link, _, towards = queue.partition(">")
    hops = _leaves(topo, path, src)
    return link in path and len(hops) == 3 and towards == hops[1] and link.startswith(hops[0])


def round_tripped(
    topo: Topology,
    queue: str,
    forward_known: bool,
    replies_known: bool,
    symmetric: bool = False,
    weight: float = 1.0,
    noise: Mapping[tuple[str, str], float] | None = None,
) -> tuple[Cluster | None, list[tuple[str, str]]]:
    """Every ordered pair probed; requests and replies each hashed onto one ECMP alternative by
    their own 5-tuple (different spreads), or (``symmetric``: Linux's multipath hash, the routed
    lab's) each reply back over its request's path; a pair is bad when its request or its reply
    leaves through ``queue`` (its vote ``weight``), or when it is in ``noise`` (pair -> its vote).
    Returns the cluster and the queue's bad pairs."""
    names = sorted(topo.nodes)
    there, back = {}, {}
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if a != b:
                alts = sorted(topo.paths(a, b), key=sorted)
                there[(a, b)] = alts[spread(i, j, len(alts))]
                rev = sorted(topo.paths(b, a), key=sorted)
                back[(a, b)] = rev[(i * j + i // 2 + j // 3) % len(rev)]  # independent of the request's
                if symmetric:
                    back[(a, b)] = there[(a, b)]
    loc = Localizer(
        topo,
        (lambda a, b: sorted(there[(a, b)])) if forward_known else None,
        (lambda a, b: sorted(back[(a, b)]) if replies_known else None),
    )
    bad: list[Symptom] = []
    good: list[Symptom] = []
    slow = []
    for (a, b), path in there.items():
        hit = _leaves_egress(topo, path, a, queue) or _leaves_egress(topo, back[(a, b)], b, queue)
        if hit:
            slow.append((a, b))
            bad.append(loc.pair_symptom((a, b), a, b, weight))
        elif (a, b) in (noise or {}):
            bad.append(loc.pair_symptom((a, b), a, b, (noise or {})[(a, b)]))
        else:
            good.append(loc.pair_symptom((a, b), a, b))
    clusters = loc.explain(bad, good)
    assert noise or len(clusters) <= 1, clusters  # noise pairs are clusters of their own
    return (clusters[0] if clusters else None), slow


def test_a_one_way_queue_seen_by_traced_requests_and_untraced_replies_is_its_link() -> None:
    # The routed lab's case: requests traced, replies hashed by their own 5-tuple (unknown). Pairs
    # slowed on their reply cross the link only as a possibility, and pairs crossing it the other
    # way (into the leaf) are healthy: undirected and request-only, the link's share of slow
    # probed paths sat near the pair guard's 75 % (the lab passed some runs, not all).
    c, slow = round_tripped(LAB, OUT_OF_LEAF_03, forward_known=True, replies_known=False)
    assert c is not None and (c.element, c.ambiguous, c.consistency) == ("leaf-03~spine-01", False, 1.0)
    assert sorted(s.ref for s in c.symptoms) == sorted(slow)
    assert c.candidates[0].element == "leaf-03~spine-01"


def test_with_replies_traced_too_the_queue_is_its_link_and_every_slow_pair_is_explained() -> None:
    c, slow = round_tripped(LAB, OUT_OF_LEAF_03, forward_known=True, replies_known=True)
    assert c is not None and (c.element, c.ambiguous, c.consistency) == ("leaf-03~spine-01", False, 1.0)
    assert c.candidates[0] == Candidate("leaf-03~spine-01", 1.0, 1.0)
    assert sorted(s.ref for s in c.symptoms) == sorted(slow)


@pytest.mark.parametrize("symmetric", [False, True], ids=["own-hash", "symmetric-hash"])
def test_a_one_way_queue_with_nothing_traced_is_one_of_the_leafs_uplinks(symmetric: bool) -> None:
    # Every round trip crosses two of the leaf's uplinks, one each way: as links, one of them
    # carries 3/4 of the pairs through the leaf, and the "one of them" consistency fell to 0.67 (the
    # lab's untraced congestion then opened nothing). Counted as traffic leaving the leaf, 1/2.
    c, _ = round_tripped(LAB, OUT_OF_LEAF_03, forward_known=False, replies_known=False, symmetric=symmetric)
    assert summary(c)[:3] == ("leaf-03", True, "one of leaf-03's 2 uplinks (leaf-03~spine-01, leaf-03~spine-02)")
    assert [(x.element, x.weight) for x in summary(c)[3]] == [("leaf-03~spine-01", 0.5), ("leaf-03~spine-02", 0.5)]
    assert summary(c)[4] == 1.0


# The routed lab's untraced congestion: RTT noise flags a pair below the leaf at a few robust sigmas
# while the queue's pairs score in the thousands (weights 1 + decades over the threshold: ~1.8 and 4,
# as base.severity_weights gives them before its normalisation). One pair below the leaf is noise
# beside them even when as slow as they are (1 of its 12 pairs, against half of those through its
# uplinks: a fault in the leaf itself hits both alike); 5 of its 12 pairs as slow is a fault below
# the leaf, and no uplink is blamed for it. (This test once asserted nothing in its second case: a
# conditional expression bound looser than the comparison.)
BELOW_LEAF_03 = [(a, b) for a in ("node-009", "node-010", "node-011") for b in ("node-010", "node-012") if a != b]


@pytest.mark.parametrize(
    ("below", "weight", "uplinks"),
    [
        pytest.param(BELOW_LEAF_03[:1], 1.8, True, id="weak-pair-below"),
        pytest.param(BELOW_LEAF_03[:1], 4.0, True, id="one-as-slow-below"),
        pytest.param(BELOW_LEAF_03, 4.0, False, id="five-of-12-as-slow-below"),
    ],
)
def test_noise_below_the_leaf_does_not_hide_its_uplinks_a_fault_below_it_does(
    below: list[tuple[str, str]], weight: float, uplinks: bool
) -> None:
    noise = dict.fromkeys(below, weight)
    found = []
    for symmetric in (False, True):
        c, slow = round_tripped(LAB, OUT_OF_LEAF_03, False, False, symmetric=symmetric, weight=4.0, noise=noise)
        assert c is not None
        found.append((c.element, c.ambiguous, c.subject if c.ambiguous else "", len(c.symptoms) == len(slow)))
    either = "one of leaf-03's 2 uplinks (leaf-03~spine-01, leaf-03~spine-02)"
    expected = ("leaf-03", True, either, True) if uplinks else ("leaf-03", False, "", False)
    assert found == [expected] * 2


def test_lossy_pairs_below_the_leaf_far_rarer_than_through_its_uplinks_are_noise() -> None:
    # Loss has no strength (every lossy pair weighs 1): what sets the pairs below apart is how few
    # of them lose. The CI run of the routed lab: 2 of the 12 pairs below the lossy leaf lost a probe
    # or two a minute on a saturated machine, beside most of the pairs through its uplinks.
    c, _ = round_tripped(LAB, OUT_OF_LEAF_03, False, False, noise=dict.fromkeys(BELOW_LEAF_03[:2], 1.0))
    assert summary(c)[:3] == ("leaf-03", True, "one of leaf-03's 2 uplinks (leaf-03~spine-01, leaf-03~spine-02)")


ALL_BELOW_LEAF_03 = [
    (a, b)
    for a in ("node-009", "node-010", "node-011", "node-012")
    for b in ("node-009", "node-010", "node-011", "node-012")
    if a != b
]
AWAY_FROM_LEAF_03 = [(f"node-00{a}", f"node-00{b}") for a in range(1, 9) for b in range(1, 9) if a != b]


@pytest.mark.parametrize(
    ("below", "away", "uplinks"),
    [
        pytest.param(4, 0, False, id="4-of-12-below-on-a-quiet-fabric"),
        pytest.param(4, 19, True, id="4-of-12-below-as-often-as-elsewhere"),
        pytest.param(5, 19, False, id="5-of-12-below-more-than-elsewhere"),
        pytest.param(12, 19, False, id="every-pair-below"),
    ],
)
def test_lossy_pairs_below_the_leaf_no_more_frequent_than_elsewhere_are_the_background(
    below: int, away: int, uplinks: bool
) -> None:
    # 32 of the 64 pairs through leaf-03's uplinks lose (half: rate 0.5, so NOISE_RATE_SHARE sets
    # aside up to 3 of the 12 pairs below). A saturated lab loses probes everywhere: 19 of the 56
    # pairs away from the leaf (0.34) make 4 below (0.33) the background; 5 (0.42) stand above it.
    noise = dict.fromkeys(ALL_BELOW_LEAF_03[:below], 1.0) | dict.fromkeys(AWAY_FROM_LEAF_03[::3][:away], 1.0)
    for symmetric in (False, True):
        c, slow = round_tripped(LAB, OUT_OF_LEAF_03, False, False, symmetric=symmetric, noise=noise)
        either = "one of leaf-03's 2 uplinks (leaf-03~spine-01, leaf-03~spine-02)"
        expected = ("leaf-03", True, either) if uplinks else ("leaf-03", False, "")
        assert (summary(c)[:3], len(slow)) == (expected, 32)
        assert c is not None and len(c.symptoms) == 32 + (0 if uplinks else below)


def test_a_symmetric_hash_with_requests_traced_still_names_the_link() -> None:
    c, slow = round_tripped(LAB, OUT_OF_LEAF_03, forward_known=True, replies_known=False, symmetric=True)
    assert c is not None and (c.element, c.ambiguous, c.consistency) == ("leaf-03~spine-01", False, 1.0)
    assert sorted(s.ref for s in c.symptoms) == sorted(slow)


def test_without_a_reply_oracle_replies_retrace_the_request_and_links_have_no_direction() -> None:
    loc = Localizer(LAB, lambda a, b: sorted(LAB.paths(a, b), key=sorted)[0])
    trips, common = loc.round_trip("node-001", "node-009")
    assert trips == loc.pair_paths("node-001", "node-009") and common == trips[0]
    assert not any(">" in e for e in common)


def test_a_round_trip_walks_each_link_in_the_direction_it_is_crossed() -> None:
    there = sorted(LAB.paths("node-001", "node-009"), key=sorted)[0]
    back = sorted(LAB.paths("node-009", "node-001"), key=sorted)[1]
    loc = Localizer(LAB, lambda a, b: sorted(there), lambda a, b: sorted(back))
    (trip,), _ = loc.round_trip("node-001", "node-009")
    assert sorted(e for e in trip if ">" in e) == [
        "leaf-01~spine-01>spine-01",
        "leaf-01~spine-02>leaf-01",
        "leaf-03~spine-01>leaf-03",
        "leaf-03~spine-02>spine-02",
        "node-001/mlx5_0~leaf-01>leaf-01",
        "node-001/mlx5_0~leaf-01>node-001/mlx5_0",
        "node-009/mlx5_0~leaf-03>leaf-03",
        "node-009/mlx5_0~leaf-03>node-009/mlx5_0",
    ]


def test_the_central_takes_replies_as_told_on_infiniband_from_the_reverse_route_else_unknown() -> None:
    from fabricd.topology import replies_of, routes_of, to_doc

    there = sorted(LAB.paths("node-001", "node-009"), key=sorted)[0]
    back = sorted(LAB.paths("node-009", "node-001"), key=sorted)[1]
    routes = {("node-001", "node-009"): sorted(there), ("node-009", "node-001"): sorted(back)}
    roce = to_doc(LAB, routes)
    assert replies_of(roce, LAB, routes_of(roce, LAB))("node-001", "node-009") is None  # ECMP: its own hash
    told = to_doc(LAB, routes, {("node-001", "node-009"): sorted(there)})
    assert replies_of(told, LAB, routes_of(told, LAB))("node-001", "node-009") == sorted(there)
    ib = fat_tree(12, 1, 4, 2, "infiniband")
    ib_doc = to_doc(ib, routes)
    assert replies_of(ib_doc, ib, routes_of(ib_doc, ib))("node-001", "node-009") == sorted(back)  # LID routing


# --- blind spots: a prober's common mode hides what all its pairs cross ----------------------------


def test_a_probers_pairs_are_blind_to_the_fabric_elements_all_of_them_cross_not_to_its_own() -> None:
    # node-001's two pairs both leave through leaf-01~spine-01 (as traced): the common mode taken out
    # of both hides a queue there, so neither clears the link or the spine; its own leaf and host
    # link are what its pairs clear. node-002's pairs cross two spines to two leaves; node-003
    # probes once (no common mode to take out).
    spine = {
        ("node-001", "node-005"): "spine-01",
        ("node-001", "node-009"): "spine-01",
        ("node-002", "node-005"): "spine-02",
        ("node-002", "node-009"): "spine-01",
        ("node-003", "node-009"): "spine-03",
    }

    def traced(a: str, b: str) -> list[str]:
        far = THREE_LEAVES.uplink(f"{b}/mlx5_0").b
        via = spine[(a, b)]
        return [f"{a}/mlx5_0~leaf-01", f"leaf-01~{via}", f"{far}~{via}", f"{b}/mlx5_0~{far}"]

    assert blind_spots(Localizer(THREE_LEAVES, traced), spine) == {
        "node-001": frozenset({"leaf-01~spine-01", "spine-01"})
    }
