"""Scenarios outside the shipped set, through the replay (``fabricd eval``'s path): each opens exactly
the incident of its fault and no other, whatever the scrape interval and fabric size.

Each case was found by a sweep of random variants (topology, place, severity, load, seed, a 5 s or
10 s interval) and failed before the change its test names: the eval's precision did not show two
of them, since an extra incident inside the fault's scope counts as the fault's.
"""

from __future__ import annotations

from typing import Any

import pytest

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


def test_the_victims_behind_a_leaf_whose_congested_uplink_no_probe_pair_shows_are_not_stragglers() -> None:
    """Six leaves of two, four HCAs, four spines: one probed pair crosses the congested uplink. The
    two nodes behind it were slow with every partner but each other, and node-003, node-010 and
    node-011 opened ``straggler`` one after the other, each slow in runs with the two while the
    count of slow nodes stayed at two. Their partners were slow in runs without them too, and the
    two victims were fast together (fabricd/detect/latency.py, ``_partners_slow_elsewhere``); every
    run across the link was slow, which stands for the pairs no prober sent through it
    (fabricd/detect/runs.py). Reported 30.7 s after the fault began: the pair's ``for`` ends 1 s
    past the two intervals after the first symptom."""
    topology = {"nodes": 12, "hcas_per_node": 4, "nodes_per_leaf": 2, "spines": 4, "link_layer": "infiniband"}
    at = "leaf-06~spine-01"
    fault = {"kind": "congestion", "at": at, "start": "180s", "severity": 0.78, "load": 0.59}
    result = ev.evaluate(_variant("v-congestion-infiniband-8", 678, "10s", topology, fault))
    assert _opened(result) == [("congestion", at)]


def test_the_nccl_runs_across_a_lossy_fabric_link_open_no_straggler_before_it_is_placed() -> None:
    """24 nodes, eight a leaf: node-016's runs across the lossy uplink were slow before its pairs
    placed the loss, and it opened ``straggler`` beside the link's ``packet_loss``; its partners
    were slow without it too (fabricd/detect/latency.py, ``_partners_slow_elsewhere``)."""
    topology = {"nodes": 24, "hcas_per_node": 2, "nodes_per_leaf": 8, "spines": 3, "link_layer": "infiniband"}
    at = "leaf-03~spine-01"
    fault = {"kind": "lossy_link", "at": at, "start": "120s", "severity": 0.89, "load": 0.62}
    result = ev.evaluate(_variant("v-lossy_link-infiniband-7", 198, "5s", topology, fault))
    assert _opened(result) == [("packet_loss", at)]


def test_a_flapping_links_next_outage_after_a_quiet_spell_is_the_flap_and_not_packet_loss() -> None:
    """8 nodes, two a leaf, four spines: three probed pairs cross the flapping uplink. Its flap
    resolved after two quiet minutes; at the next outage the flap waited an interval (its pairs all
    end at one node: ``shared_end_hold``) while the same pairs' 60 s loss mean crossed 0.3 % in that
    scrape, and ``packet_loss`` opened on the link 0.6 s before the flap reopened. An outage's
    pairs are the flap detector's while it waits (fabricd/detect/loss.py, ``_loss``)."""
    topology = {"nodes": 8, "hcas_per_node": 1, "nodes_per_leaf": 2, "spines": 4, "link_layer": "infiniband"}
    at = "leaf-04~spine-02"
    fault = {"kind": "link_flap", "at": at, "start": "120s", "severity": 0.46, "load": 0.41}
    result = ev.evaluate(_variant("v-link_flap-infiniband-6", 124, "5s", topology, fault))
    assert _opened(result) == [("link_flap", at)]


def test_a_pfc_storm_whose_rules_run_out_with_the_pausing_roots_is_not_hol_blocking_too() -> None:
    """At a 10 s scrape on a 6-node fabric the storm rule and the "pausing root" rule ran out in the
    same scrape: the storm was proposed first, and the root's stalled pairs then opened HOL blocking
    on the same port (fabricd/detect/hol.py, ``_storm_now``)."""
    topology = {"nodes": 6, "hcas_per_node": 2, "nodes_per_leaf": 2, "spines": 3, "link_layer": "roce"}
    at = "node-005/mlx5_1"
    fault = {"kind": "pfc_storm", "at": at, "start": "180s", "severity": 0.76, "load": 0.73}
    result = ev.evaluate(_variant("storm-6", 627, "10s", topology, fault))
    assert _opened(result) == [("pfc_storm", at)]
    assert result.faults[0].on_time


def test_a_pfc_storm_that_starts_mid_scrape_is_reported_within_two_intervals() -> None:
    """At a 5 s scrape the first scrape after the onset sees part of an interval (here 74 % paused);
    the storm rule then waited for two whole intervals above 80 % and opened 17.7 s after the onset,
    past the deadline (symptoms + 2 intervals): rules/detection/pfc.yaml, ``pause_storm_tx``."""
    topology = {"nodes": 24, "hcas_per_node": 4, "nodes_per_leaf": 4, "spines": 3, "link_layer": "roce"}
    at = "node-002/mlx5_2"
    fault = {"kind": "pfc_storm", "at": at, "start": "120s", "severity": 0.82, "load": 0.4}
    result = ev.evaluate(_variant("storm-24", 151, "5s", topology, fault))
    assert _opened(result) == [("pfc_storm", at)]
    (found,) = result.faults
    assert found.on_time, found


def test_an_hol_whose_root_is_not_seen_yet_opens_no_congestion_on_a_paused_hosts_leaf() -> None:
    """On a 6-node fabric at a 10 s scrape, HOL waited a scrape for its root's marks while a paused
    host's first slow pairs (its pause rule not fired yet) and the pending pairs through it voted
    for that host's leaf: congestion opened on ``leaf-02`` 2.5 s before HOL blocking on the root
    (fabricd/detect/hol.py, ``_claim_victims``)."""
    topology = {"nodes": 6, "hcas_per_node": 2, "nodes_per_leaf": 2, "spines": 2, "link_layer": "roce"}
    at = "node-005/mlx5_1"
    fault = {"kind": "hol_blocking", "at": at, "start": "150s", "severity": 0.61, "load": 0.35}
    result = ev.evaluate(_variant("hol-6", 503, "10s", topology, fault))
    assert _opened(result) == [("hol_blocking", at)]


def test_a_storms_victims_pending_pairs_make_no_stalled_leaf_and_no_hol_beside_it() -> None:
    """A storm claims its victims' slow pairs, fired and pending; the no-pause-counter HOL path
    counted the pending ones still, found the storm's leaf stalled, and opened HOL blocking on the
    one port of it not stalled (a paused neighbour) 7 s after the storm (fabricd/detect/hol.py,
    ``_slow_pairs``)."""
    topology = {"nodes": 24, "hcas_per_node": 4, "nodes_per_leaf": 8, "spines": 4, "link_layer": "roce"}
    at = "node-015/mlx5_0"
    fault = {"kind": "pfc_storm", "at": at, "start": "120s", "severity": 0.6, "load": 0.5}
    result = ev.evaluate(_variant("storm-24-8", 8, "10s", topology, fault))
    assert _opened(result) == [("pfc_storm", at)]


def test_a_straggler_on_a_4_node_fabric_is_reported_within_two_intervals() -> None:
    """On 4 nodes the straggler's partner is as slow as it in each run together: judged against the
    members' latest runs, half the fleet was slow at once, and the straggler scored 9 on its first
    slow run, 0.7 on its second; the efficiency rule reported it three runs later, 11.3 s after
    the symptom (fabricd/detect/latency.py, ``FLEET_RUNS``)."""
    topology = {"nodes": 4, "hcas_per_node": 4, "nodes_per_leaf": 2, "spines": 3, "link_layer": "infiniband"}
    fault = {"kind": "straggler", "at": "node-002", "start": "180s", "severity": 0.6, "load": 0.53}
    result = ev.evaluate(_variant("v-straggler-infiniband-2", 466, "5s", topology, fault))
    assert _opened(result) == [("straggler", "node-002")]
    (found,) = result.faults
    assert found.on_time, found


def test_a_prober_whose_every_path_crosses_the_congested_link_does_not_clear_it() -> None:
    """node-024's four probed paths all crossed the congested uplink: its prober's common mode took
    the queue out of all four, they counted as healthy paths through the link, and the link sat at
    0.70-0.72 consistency against the guard's 0.75 for 20 s, 26 s after the first symptoms in all
    (fabricd/detect/base.py, ``blind_spots``)."""
    topology = {"nodes": 48, "hcas_per_node": 2, "nodes_per_leaf": 8, "spines": 2, "link_layer": "infiniband"}
    at = "leaf-03~spine-02"
    fault = {"kind": "congestion", "at": at, "start": "90s", "severity": 0.54, "load": 0.53}
    result = ev.evaluate(_variant("v-congestion-infiniband-1", 642, "10s", topology, fault))
    assert _opened(result) == [("congestion", at)]
    (found,) = result.faults
    assert found.on_time, found


def test_the_first_outage_pairs_into_a_flapping_host_link_do_not_open_the_fabric_link_they_crossed() -> None:
    """The first two pairs to lose their probes both went to node-001 over leaf-04~spine-03 (the
    routes to a destination share its spine); the flap opened on that fabric link, 1.2 s before the
    host link with seven pairs (fabricd/detect/network.py, ``_shared_end``)."""
    topology = {"nodes": 8, "hcas_per_node": 1, "nodes_per_leaf": 2, "spines": 3, "link_layer": "infiniband"}
    at = "node-001/mlx5_0~leaf-01"
    fault = {"kind": "link_flap", "at": at, "start": "180s", "severity": 0.76, "load": 0.75}
    result = ev.evaluate(_variant("v-link_flap-infiniband-2", 833, "5s", topology, fault))
    assert _opened(result) == [("link_flap", at)]


@pytest.mark.parametrize(
    ("topology", "at"),
    [
        pytest.param(
            {"nodes": 8, "hcas_per_node": 1, "nodes_per_leaf": 2, "spines": 3, "link_layer": "infiniband"},
            "leaf-02~spine-01",
            id="ib-8",
        ),
        pytest.param(
            {"nodes": 16, "hcas_per_node": 2, "nodes_per_leaf": 4, "spines": 2, "link_layer": "roce"},
            "leaf-03~spine-02",
            id="roce-16",
        ),
    ],
)
def test_a_flapping_fabric_link_is_one_flap_on_that_link(topology: dict[str, Any], at: str) -> None:
    """No fault of the shipped set flaps a fabric link. On 8 InfiniBand nodes every pair of node-004
    crossed it (one spine carries all traffic to a destination) and its host link opened first;
    on 16 RoCE nodes the retransmits an outage leaves for the next scrape opened ``packet_loss`` on
    another leaf between outages (fabricd/detect/loss.py, ``_claim_crossing``)."""
    fault = {"kind": "link_flap", "at": at, "start": "150s", "severity": 0.8, "load": 0.6}
    result = ev.evaluate(_variant(f"ff-{at}", 77, "5s", topology, fault))
    assert _opened(result) == [("link_flap", at)]
    (found,) = result.faults
    assert found.on_time, found


@pytest.mark.parametrize(
    ("topology", "at", "seed", "severity", "load"),
    [
        pytest.param(
            {"nodes": 16, "hcas_per_node": 1, "nodes_per_leaf": 4, "spines": 2, "link_layer": "infiniband"},
            "leaf-03~spine-01",
            127,
            0.55,
            0.41,
            id="ib-16",
        ),
        pytest.param(
            {"nodes": 12, "hcas_per_node": 1, "nodes_per_leaf": 2, "spines": 3, "link_layer": "infiniband"},
            "leaf-01~spine-03",
            993,
            0.82,
            0.76,
            id="ib-12",
        ),
    ],
)
def test_a_lossy_fabric_link_with_sequence_errors_behind_two_leaves_is_reported_within_two_intervals(
    topology: dict[str, Any], at: str, seed: int, severity: float, load: float
) -> None:
    """A lossy fabric link's pairs fire one by one (each once its 60 s window holds about two lost
    probes): half of its probed paths were lossy 47 s (ib-16) and 32 s (ib-12) after the fault, at
    10 s scrapes. The sequence errors at the ends of RDMA flows across it, behind two leaves at
    least, say the fabric drops packets; a quarter of the paths then places it
    (rules/detection/loss.yaml, ``loss_consistency_corroborated``)."""
    fault = {"kind": "lossy_link", "at": at, "start": "120s", "severity": severity, "load": load}
    result = ev.evaluate(_variant(f"lf-{at}", seed, "10s", topology, fault))
    assert _opened(result) == [("packet_loss", at)]
    (found,) = result.faults
    assert found.on_time, found
