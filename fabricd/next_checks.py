"""What an on-call engineer checks next, per incident kind, naming the incident's own elements.

Pure: the incident's JSON (``GET /api/v1/incidents/{id}``) in, numbered sentences out, shown by the
CLI page and the HTML report. Elements are read in the forms the detectors write them
(``fabricd/model.py`` Candidate): a link ``a~b``, an HCA port ``node/device``, a host link
``node/device~leaf``, a switch or a node without either. The checks follow the kind's usual root
causes (docs/detection.md): a hot queue for congestion, a bad cable or optic for loss and flaps, a
port that pauses without end for PFC storms and head-of-line blocking, a slow GPU or NIC for a
straggler, a busy host for tail latency.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

MAX_NAMED = 3  # elements named in one sentence: more is a list nobody reads at 3 a.m.
# A candidate is a place to look first when it scores at least this share of the best one: the
# score is the share of the bad evidence an element explains times how consistently its paths are
# bad (fabricd/detect/votes.py, Tally.score), so one under half the best explains less than half as
# much. The live demo's link scored 1.0 and a sibling uplink 0.2: sending the engineer to both
# switches' counters at once halves the value of the localization; the sibling is a next candidate.
FIRST_LOOK_SHARE = 0.5


def and_join(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"


def is_link(element: str) -> bool:
    return "~" in element


def is_port(element: str) -> bool:
    return "/" in element and "~" not in element


def is_fabric_link(element: str) -> bool:
    return "~" in element and "/" not in element


def ends(link: str) -> tuple[str, str]:
    a, _, b = link.partition("~")
    return a, b


def node_of(element: str) -> str:
    return element.split("/", 1)[0].split("~", 1)[0]


def pairs_of(inc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(a, b) for a, _, b in (x.partition("|") for x in inc.get("affected", []) if "|" in x)]


def ranked(inc: dict[str, Any]) -> list[str]:
    """Candidate elements, best score first (name order among equals), the incident's element first
    when it has no candidates."""
    cands = sorted(inc.get("candidates", []), key=lambda c: (-round(float(c["score"]), 3), c["element"]))
    return [c["element"] for c in cands] or [inc["element"]]


def next_checks(inc: dict[str, Any]) -> list[str]:
    steps = _BY_KIND.get(inc["kind"], _generic)(inc)
    return [*steps, f"The whole picture, with plots: fabricd report --incident {inc['id']}"]


def _focus(inc: dict[str, Any], keep: Callable[[str], bool], *, first_look: bool = False) -> list[str]:
    """The incident's element when it passes ``keep``, then the best candidates that do; with
    ``first_look``, only those scoring at least ``FIRST_LOOK_SHARE`` of the best candidate."""
    out = [inc["element"]] if keep(inc["element"]) else []
    cands = inc.get("candidates", [])
    floor = FIRST_LOOK_SHARE * max((float(c["score"]) for c in cands), default=0.0) if first_look else 0.0
    scores = {c["element"]: float(c["score"]) for c in cands}
    out += [e for e in ranked(inc) if keep(e) and e not in out and scores.get(e, 0.0) >= floor]
    return out[:MAX_NAMED]


def _signals(inc: dict[str, Any]) -> set[str]:
    return {e["signal"] for e in inc.get("evidence", [])}


def _pinned_pair(inc: dict[str, Any], near: str) -> str:
    """An affected pair to probe again (one touching ``near`` when there is one)."""
    pairs = pairs_of(inc)
    touching = [p for p in pairs if near and node_of(near) in p]
    if touching or pairs:
        a, b = (touching or pairs)[0]
        return f"between {a} and {b} (an affected pair)"
    return f"between two hosts whose path crosses {near}"


def _switch_ports(inc: dict[str, Any]) -> tuple[str, list[str]]:
    """Where the queue may be, as an engineer finds it on a switch, and the switches to log in to."""
    links = _focus(inc, is_fabric_link, first_look=True)
    if links:
        return f"{and_join(links)}, on both ends", sorted({end for link in links for end in ends(link)})
    host_links = _focus(inc, lambda e: is_link(e) and not is_fabric_link(e))
    if host_links:
        port, switch = ends(host_links[0])
        return f"the port of {switch} facing {port}", [switch]
    switches = _focus(inc, lambda e: not is_link(e) and not is_port(e))
    return f"the ports of {and_join(switches)}", switches


def _congestion(inc: dict[str, Any]) -> list[str]:
    where, switches = _switch_ports(inc)
    ib = bool(_signals(inc) & {"xmit_wait_ratio"})
    counters = (
        "PortXmitWait, PortXmitData and PortXmitDiscards (perfquery -x)"
        if ib
        else "egress queue depth, ECN-marked and dropped packets, PFC pause frames sent and received"
    )
    config = (
        "the congestion control and VL arbitration settings"
        if ib
        else "the ECN marking thresholds (Kmin/Kmax) and the PFC-enabled priority: they must match the hosts' "
        "RoCE traffic class"
    )
    steps = [
        f"Read the switch-side counters of {where}: {counters}. The hosts only see what reached them; the "
        "switch shows which queue holds the traffic.",
        f"On {and_join(switches)}, check {config}.",
    ]
    first = _focus(inc, is_fabric_link, first_look=True)
    if first:
        steps.append(
            f"Compare {first[0]} with its sibling uplinks: much more traffic on it than on them means the ECMP "
            "hash puts too many of the affected flows there (move or re-hash them); the same load everywhere "
            "means the fabric is simply oversubscribed."
        )
    later = [e for e in _focus(inc, is_fabric_link) if e not in first]
    if first and later:
        steps.append(
            f"If {and_join(first)} {'is' if len(first) == 1 else 'are'} clean, the next candidates: {and_join(later)}."
        )
    return steps


def _loss(inc: dict[str, Any]) -> list[str]:
    target = _focus(inc, lambda e: is_link(e) or is_port(e))
    element = target[0] if target else inc["element"]
    if is_link(element):
        a, b = ends(element)
        sides = f"both ends ({a} and {b})"
    else:
        sides = element
    steps = [
        f"Inspect the cable and transceivers of {element}: reseat or replace them; read the optics on {sides} "
        "(ethtool -m or mlxlink -m: temperature, Rx/Tx power).",
        f"Read the port error counters on {sides}: symbol and CRC errors, link downed, link error recovery "
        f"(the host end: fabricd ports --node {node_of(element)}; the switch end: its port counters and log).",
        f"Run a pinned probe {_pinned_pair(inc, element)}, with a fixed source port so ECMP keeps it on this "
        "path: loss that follows the link confirms it.",
    ]
    if len(target) > 1:
        steps.append(f"If {element} is clean, the next candidates: {and_join(target[1:])}.")
    return steps


def _pauses(inc: dict[str, Any]) -> list[str]:
    ports = _focus(inc, is_port)
    source = ports[0] if ports else inc["element"]
    node = node_of(source)
    paused = sorted(
        {f"{e['node']}/{e['device']}" for e in inc.get("evidence", []) if e["signal"] == "rx_pause_ratio"} - {source}
    )
    steps = [
        f"Find why {source}, the pause source port, pauses its link partner: on {node}, a receiver that "
        "cannot drain (NIC firmware, PCIe errors, a hung or starved process reading its queues).",
        f"Check the PFC watchdog (storm prevention) on the switch port facing {source} and on the NIC "
        "(mlx5 tx_pause_storm counters): it should stop honouring pauses from a port that never stops.",
    ]
    if paused:
        steps.append(f"Once it stops, the paused ports should recover: {and_join(paused[:MAX_NAMED])}.")
    return steps


def _straggler(inc: dict[str, Any]) -> list[str]:
    node = node_of(inc["element"])
    return [
        f"Check {node}'s GPUs: nvidia-smi -q (clocks, power and thermal throttling, ECC errors) and XID "
        "errors in its kernel log.",
        f"Check {node}'s NICs and PCIe: fabricd ports --node {node} (link rate and errors against its "
        "peers), and each HCA's PCIe link width and speed (lspci -vv).",
        f"Run a pinned NCCL test: all_reduce_perf on {node} with one known-good node, then on that node "
        f"with another good one; slow only with {node} confirms it.",
    ]


def _tail(inc: dict[str, Any]) -> list[str]:
    element = inc["element"]
    return [
        f"Check host jitter on {node_of(element)}: CPU load and steal, the NIC's interrupt affinity, "
        "power-saving C-states; a busy host answers probes late.",
        f"Run a pinned probe {_pinned_pair(inc, element)}, and one between two hosts away from {element}; "
        "compare their p99 RTT.",
    ]


def _generic(inc: dict[str, Any]) -> list[str]:
    return [
        f"Read the counters of {and_join(_focus(inc, lambda e: True))}: fabricd ports --node {node_of(inc['element'])}."
    ]


_BY_KIND: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "congestion": _congestion,
    "packet_loss": _loss,
    "link_flap": _loss,
    "pfc_storm": _pauses,
    "hol_blocking": _pauses,
    "straggler": _straggler,
    "tail_latency": _tail,
}
