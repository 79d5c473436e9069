"""Scenarios outside the shipped set, through the replay (``fabricd eval``'s path): each opens exactly
the incident of its fault and no other, whatever the scrape interval and fabric size.

Each case was found by a sweep of random variants (topology, place, severity, load, seed, a 5 s or
10 s interval) and failed before the change its test names: the eval's precision did not show two
of them, since an extra incident inside the fault's scope counts as the fault's.
"""

from __future__ import annotations

from typing import Any

from fabricd.sim import eval as ev
from fabricd.sim.scenario import load, parse


def _variant(name: str, seed: int, interval: str, topology: dict[str, Any], fault: dict[str, Any]) -> Any:
    start = int(fault["start"].rstrip("s"))
    return parse(
        {
            "name": name,
            "seed": seed,
            "duration": f"{start + 300}s",
            "interval": interval,
            "topology": topology,
            "workload": {"kind": "allreduce", "load": fault.pop("load")},
            "faults": [{**fault, "end": f"{start + 240}s"}],
        },
        name,
    )


def _opened(result: ev.ScenarioResult) -> list[tuple[str, str]]:
    return [(o["kind"], o["element"]) for o in result.opened]


def test_a_pfc_storm_scraped_every_5s_is_a_storm_and_not_hol_blocking_too() -> None:
    """At a 5 s scrape the "pausing root" rule (tx pauses > 10 % for 5 s) ran out a scrape before
    the storm rule (> 80 % for 5 s) and opened HOL blocking on the storming port beside the storm
    (fabricd/detect/hol.py, ``_storm_pending``)."""
    sc = load("pfc-storm-roce", interval="5s")
    result = ev.evaluate(sc)
    assert _opened(result) == [("pfc_storm", sc.faults[0].at)]


def test_a_link_flaps_loss_window_and_its_peers_retransmits_are_the_flap() -> None:
    """After its outages, the flapping link's pairs kept their 60 s loss window and opened a second
    flap on a neighbour's link; retransmits on another leaf, at the peers of flows through the link,
    opened ``packet_loss`` there, and pending pairs through the link ``packet_loss`` on the link
    itself (fabricd/detect/loss.py)."""
    topology = {"nodes": 48, "hcas_per_node": 2, "nodes_per_leaf": 8, "spines": 3, "link_layer": "infiniband"}
    at = "node-023/mlx5_0~leaf-03"
    fault = {"kind": "link_flap", "at": at, "start": "150s", "severity": 0.66, "load": 0.45}
    result = ev.evaluate(_variant("flap-48", 823, "5s", topology, fault))
    assert _opened(result) == [("link_flap", at)]


def test_an_hol_roots_last_marks_as_the_incast_ends_are_not_congestion() -> None:
    """The scrape holding the end of the incast still shows the root's marks and the senders' CNPs
    with no pauses left: they opened congestion on the root's host link as the fault cleared
    (fabricd/detect/hol.py, ``_winding_down``)."""
    topology = {"nodes": 8, "hcas_per_node": 1, "nodes_per_leaf": 2, "spines": 4, "link_layer": "roce"}
    at = "node-006/mlx5_0"
    fault = {"kind": "hol_blocking", "at": at, "start": "90s", "severity": 0.53, "load": 0.78}
    result = ev.evaluate(_variant("hol-8", 540, "10s", topology, fault))
    assert _opened(result) == [("hol_blocking", at)]


def test_one_isolated_bit_error_beside_a_lossy_links_sequence_errors_is_no_second_lossy_link() -> None:
    """At a 5 s scrape one symbol error is 0.2/s, over phy_errors' 0.1/s: pending for one scrape on
    a port whose flows crossed the lossy link (its sequence errors fired, weak), it made that port's
    link a second ``packet_loss`` (fabricd/detect/network.py, ``weak_alone_waits``)."""
    topology = {"nodes": 8, "hcas_per_node": 1, "nodes_per_leaf": 4, "spines": 3, "link_layer": "roce"}
    at = "node-002/mlx5_0~leaf-01"
    fault = {"kind": "lossy_link", "at": at, "start": "90s", "severity": 0.63, "load": 0.48}
    result = ev.evaluate(_variant("lossy-8", 20, "5s", topology, fault))
    assert _opened(result) == [("packet_loss", at)]


def test_the_victims_of_a_congested_link_no_probe_pair_shows_are_not_stragglers() -> None:
    """12 nodes, two a leaf, four spines: one probed pair crosses the congested link, under the pair
    guard, so no congestion is reported. Every NCCL run across the link was slow, and three nodes
    behind it, each slow with two partners in a row, opened ``straggler`` ("clean network"). Other
    runs across the link, with none of them, were slow too: the slowness is shared, not a node's
    (fabricd/detect/latency.py, ``_slow_elsewhere``). Only the fault's own incident may open."""
    topology = {"nodes": 12, "hcas_per_node": 1, "nodes_per_leaf": 2, "spines": 4, "link_layer": "infiniband"}
    at = "leaf-05~spine-04"
    fault = {"kind": "congestion", "at": at, "start": "90s", "severity": 0.84, "load": 0.37}
    result = ev.evaluate(_variant("congestion-12", 999, "5s", topology, fault))
    assert set(_opened(result)) <= {("congestion", at)}


def test_a_pfc_storm_whose_rules_run_out_with_the_pausing_roots_is_not_hol_blocking_too() -> None:
    """At a 10 s scrape on a 6-node fabric the storm rule and the "pausing root" rule ran out in the
    same scrape: the storm was proposed first, and the root's stalled pairs then opened HOL blocking
    on the same port (fabricd/detect/hol.py, ``_storm_now``)."""
    topology = {"nodes": 6, "hcas_per_node": 2, "nodes_per_leaf": 2, "spines": 3, "link_layer": "roce"}
    at = "node-005/mlx5_1"
    fault = {"kind": "pfc_storm", "at": at, "start": "180s", "severity": 0.76, "load": 0.73}
    result = ev.evaluate(_variant("storm-6", 627, "10s", topology, fault))
    assert _opened(result) == [("pfc_storm", at)]
