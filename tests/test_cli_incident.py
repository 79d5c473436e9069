"""``fabricd incident ID`` against a real ``fabricd server``: the page an on-call engineer acts on.

The demo incident is the real one: the demo scenario (``fabricd/sim/scenarios/demo.yaml``, its fault
and fleet unchanged, cut to 4 minutes) replayed through the collectors, the store and the detection
loop (tests/support/simstore.py). What the page must say about it is checked against the REST API's
JSON for the same incident, and against the rule files by hand (``> 20k packets/s`` is
rules/detection/congestion.yaml's cnp_sent). Incidents of the other kinds, and ties at chosen
places, are stored as the engine would store them (synthetic: written here, field by field).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from fabricd.cli import main
from fabricd.detect import base
from fabricd.detect.findings import Finding
from fabricd.detect.rules import load_rules
from fabricd.model import Candidate, Evidence, Incident, IncidentKind, IncidentState, Severity
from fabricd.server import db
from fabricd.server.store.storage import Storage
from fabricd.sim.scenario import load
from fabricd.timeparse import iso
from tests.support.server import ServerProcess
from tests.support.simstore import StoredFleet, stored_fleet
from tests.test_localize_partial import THREE_LEAVES, probed

pytestmark = pytest.mark.slow

DEMO_LINK = "leaf-02~spine-01"  # demo.yaml's fault
DEMO = load(
    "demo",
    duration="4m",
    faults=[{"kind": "congestion", "at": DEMO_LINK, "start": "75s", "end": "4m", "severity": 0.7}],
    delivery={"mode": "aligned"},  # the fixture replays aligned rounds (tests/support/simstore.py)
)
# The rules' thresholds, as rules/detection/*.yaml write them, in the units an engineer reads.
THRESHOLDS = {
    "ecn_marked_ratio": "> 2%",
    "cnp_sent_packets_per_second": "> 20k packets/s",
    "cnp_handled_packets_per_second": "> 20k packets/s",
    "xmit_wait_ratio": "> 5%",
    "rtt_p99_outlier": "> 6",
    "rtt_queue_outlier": "> 6",
}
T0 = 1_700_000_000.0
AMBIGUOUS = probed(THREE_LEAVES, "leaf-02~spine-01", known=lambda a, b: False)
assert AMBIGUOUS is not None


@dataclass
class Env:
    fleet: StoredFleet
    server: ServerProcess
    ids: dict[str, int]  # "demo" and the synthetic incidents, by name

    def page(self, capsys: pytest.CaptureFixture[str], name: str) -> str:
        code = main(["incident", str(self.ids[name]), "--server", self.server.url, "--token", self.fleet.read_token])
        out = capsys.readouterr().out
        assert code == 0, out
        return out

    def json(self, capsys: pytest.CaptureFixture[str], name: str) -> Any:
        import json

        args = [
            "incident",
            str(self.ids[name]),
            "--json",
            "--server",
            self.server.url,
            "--token",
            self.fleet.read_token,
        ]
        assert main(args) == 0
        return json.loads(capsys.readouterr().out)


def synthetic(name: str, kind: IncidentKind, element: str, **fields: Any) -> Incident:
    return Incident(
        key=f"{kind.value}:{element}",
        kind=kind,
        severity=Severity.WARNING,
        state=IncidentState.OPEN,
        element=element,
        summary=f"{element} {name}",
        started_ts=T0,
        updated_ts=T0 + 60,
        timeline=[(T0, "first symptom"), (T0 + 10, f"opened: {element} {name}")],
        **fields,
    )


SYNTHETIC = {
    "ties": synthetic(
        "is congested",
        IncidentKind.CONGESTION,
        "leaf-01",
        candidates=[
            Candidate("leaf-01~spine-02", 0.25, 0.5),
            Candidate("leaf-02", 0.125, 0.25),
            Candidate("leaf-01", 0.5, 1.0),
            Candidate("leaf-01~spine-01", 0.25, 0.5),
        ],
        affected=["node-001", "node-002"],
    ),
    "flap": synthetic(
        "flaps",
        IncidentKind.LINK_FLAP,
        "node-003/mlx5_1~leaf-01",
        candidates=[Candidate("node-003/mlx5_1~leaf-01", 0.5, 1.0), Candidate("node-003/mlx5_1", 0.5, 1.0)],
        affected=["node-003", "node-003|node-004"],
        evidence=[
            Evidence("link_downs_per_second", "node-003", "mlx5_1", "1", 0.2, 0.0, T0 + 5, (), "", ">", "per_second")
        ],
    ),
    "storm": synthetic(
        "is in a PFC pause storm",
        IncidentKind.PFC_STORM,
        "node-002/mlx5_0",
        candidates=[Candidate("node-002/mlx5_0", 1.0), Candidate("node-002/mlx5_0~leaf-01", 0.5)],
        affected=["node-001", "node-002"],
        evidence=[
            Evidence(
                "tx_pause_ratio", "node-002", "mlx5_0", "", 0.9, 0.5, T0 + 5, (("priority", "3"),), "", ">", "ratio"
            ),
            Evidence(
                "rx_pause_ratio", "node-001", "mlx5_0", "", 0.8, 0.2, T0 + 5, (("priority", "3"),), "", ">", "ratio"
            ),
        ],
    ),
    "straggler": synthetic(
        "is a straggler",
        IncidentKind.STRAGGLER,
        "node-004",
        candidates=[Candidate("node-004", 1.0)],
        affected=["node-004"],
        evidence=[
            Evidence("nccl_efficiency_sustained", "node-004", "all_reduce", "", 0.4, 0.6, T0 + 5, (), "", "<", "ratio")
        ],
    ),
    # Evidence as stored before it carried the rule's op and the signal's unit: the page takes the unit
    # from the signal table and shows the threshold without a comparison it does not know.
    "old": synthetic(
        "is congested",
        IncidentKind.CONGESTION,
        "leaf-03",
        evidence=[Evidence("ecn_marked_ratio", "node-009", "mlx5_0", "1", 0.12, 0.02, T0 + 5)],
    ),
    # As the localizer places a leaf-02 uplink fault that no traced path narrows down
    # (tests/test_localize_partial.py): one of its 4 uplinks, a quarter of the weight each.
    "ambiguous": synthetic(
        "is dropping packets",
        IncidentKind.PACKET_LOSS,
        AMBIGUOUS.element,
        candidates=AMBIGUOUS.candidates,
        ambiguous=AMBIGUOUS.ambiguous,
        affected=["node-005|node-001"],
    ),
    "tail": synthetic(
        "answers late",
        IncidentKind.TAIL_LATENCY,
        "node-005",
        candidates=[Candidate("node-005", 0.8)],
        affected=["node-001|node-005", "node-002|node-005"],
    ),
}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    fleet = stored_fleet(DEMO, tmp_path_factory.mktemp("incident"))
    engine = db.make_engine(fleet.db_url)
    store = Storage.open(engine)
    demo = [r for r in store.incidents.query() if r.element == DEMO_LINK and r.kind == "congestion"]
    assert demo, f"the demo replay opened no congestion incident on {DEMO_LINK}: {store.incidents.query()}"
    ids = {"demo": demo[0].id} | {name: store.incidents.upsert(inc)[0] for name, inc in SYNTHETIC.items()}
    engine.dispose()
    server = ServerProcess(fleet.data_dir, db=fleet.db_url, extra=["--log-level", "warning"]).start()
    try:
        yield Env(fleet, server, ids)
    finally:
        server.stop()


# --- reading the page ----------------------------------------------------------------------------


def sections(page: str) -> dict[str, list[str]]:
    """Title (its first word) -> the section's lines after the title; the head is ``head``."""
    parts = page.rstrip("\n").split("\n\n")
    out = {"head": parts[0].split("\n")}
    for part in parts[1:]:
        lines = part.split("\n")
        out[lines[0].split(" ", 1)[0].rstrip(":")] = lines
    return out


def rows(lines: list[str]) -> list[list[str]]:
    """The table rows of a section (header first): cells are two or more spaces apart."""
    return [re.split(r"\s{2,}", line.strip()) for line in lines if line.startswith("  ") and not line.startswith("   ")]


def steps(lines: list[str]) -> list[str]:
    """The numbered next checks, each unwrapped to one line."""
    out: list[str] = []
    for line in lines[1:]:
        if re.match(r"  \d+\. ", line):
            out.append(line.split(". ", 1)[1])
        else:
            out[-1] += " " + line.strip()
    return out


def packets(v: float) -> str:
    return f"{v / 1e3:.3g}k packets/s" if v >= 1e3 else f"{v:.3g} packets/s"


def expected_value(signal: str, v: float) -> str:
    if signal.endswith("_ratio"):
        return f"{v * 100:.3g}%"
    if signal.endswith("_packets_per_second"):
        return packets(v)
    return f"{v:.3g}"  # a score


# --- the acceptance bullets ---------------------------------------------------------------------


def test_page_shows_the_affected_nodes_and_pairs_the_api_returns(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    inc = env.json(capsys, "demo")
    page = sections(env.page(capsys, "demo"))
    nodes = [a for a in inc["affected"] if "|" not in a]
    pairs = [a.replace("|", " -> ") for a in inc["affected"] if "|" in a]
    assert nodes and pairs, inc["affected"]
    assert page["Affected"][0] == f"Affected: {len(nodes)} nodes, {len(pairs)} node pairs"
    assert listed(page["Affected"][1:]) == {"nodes": nodes, "node pairs": pairs}
    assert all(len(line) <= 110 for line in page["Affected"])


def listed(lines: list[str]) -> dict[str, list[str]]:
    """``nodes  a, b,`` / ``      c`` / ``node pairs  x -> y`` -> {"nodes": [a, b, c], "node pairs": [...]}."""
    text: dict[str, str] = {}
    label = ""
    for line in lines:
        for name in ("node pairs", "nodes"):
            if line.startswith(f"  {name} "):
                label, line = name, line[len(name) + 2 :]
                break
        text[label] = f"{text.get(label, '')} {line.strip()}".strip()
    return {k: v.split(", ") for k, v in text.items()}


def test_evidence_has_units_and_the_rule_thresholds(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    inc = env.json(capsys, "demo")
    ev = inc["evidence"]
    assert "cnp_sent_packets_per_second" in {e["signal"] for e in ev}
    table = rows(sections(env.page(capsys, "demo"))["Evidence"])
    assert table[0] == ["signal", "where", "value", "threshold", "at"]
    by_excess = sorted(ev, key=lambda e: e["value"] / e["threshold"], reverse=True)  # every demo rule is ">"

    def where(e: dict[str, Any]) -> str:
        if e["signal"] in ("rtt_p99_outlier", "rtt_queue_outlier"):
            return f"{e['node']} -> {e['device']}"
        return f"{e['node']}/{e['device']}/{e['port']}"

    assert table[1:] == [
        [e["signal"], where(e), expected_value(e["signal"], e["value"]), THRESHOLDS[e["signal"]], iso(e["ts"])]
        for e in by_excess
    ]
    assert {(e["op"], e["unit"]) for e in ev if e["signal"] == "cnp_sent_packets_per_second"} == {
        (">", "packets_per_second")
    }


def test_candidates_are_sorted_by_score_and_ties_are_called_ties(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    loc = sections(env.page(capsys, "ties"))["Localization"]
    assert loc == [
        "Localization (candidates by score, best first)",
        "  rank  element           score  weight",
        "  1     leaf-01           0.500  1.000",
        "  2=    leaf-01~spine-01  0.250  0.500   tie",
        "  2=    leaf-01~spine-02  0.250  0.500   tie",
        "  4     leaf-02           0.125  0.250",
        "Tie leaf-01~spine-01 and leaf-01~spine-02 score 0.250 each: the evidence does not tell them apart.",
    ]
    loc = sections(env.page(capsys, "flap"))["Localization"]
    assert loc[2:] == [
        "  1=    node-003/mlx5_1          0.500  1.000   tie",
        "  1=    node-003/mlx5_1~leaf-01  0.500  1.000   tie",
        "Tie at the top: node-003/mlx5_1 and node-003/mlx5_1~leaf-01 score 0.500 each: the evidence does not "
        "tell them apart, check each.",
    ]
    # The demo incident's candidates, as the page lists them: by score, best first.
    cands = env.json(capsys, "demo")["candidates"]
    shown = rows(sections(env.page(capsys, "demo"))["Localization"])[1:]
    assert shown[0][1] == DEMO_LINK
    assert [(r[1], float(r[2])) for r in shown] == sorted(
        ((c["element"], round(c["score"], 3)) for c in cands), key=lambda ec: (-ec[1], ec[0])
    )


def test_an_ambiguous_incident_lists_the_candidates_it_cannot_tell_apart_with_their_weights(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    inc = env.json(capsys, "ambiguous")
    uplinks = [f"leaf-02~spine-0{k}" for k in range(1, 5)]
    assert (inc["element"], inc["ambiguous"]) == ("leaf-02", True)
    assert [(c["element"], c["weight"]) for c in inc["candidates"]] == [(u, 0.25) for u in uplinks]
    assert sections(env.page(capsys, "ambiguous"))["Localization"] == [
        "Localization (ambiguous: one of these 4, weighted by the evidence)",
        "  rank  element           score  weight",
        *(f"  1=    {u}  0.062  0.250   tie" for u in uplinks),
        f"Ambiguous: the evidence cannot tell {', '.join(uplinks[:3])} and {uplinks[3]} apart; the fault is on one "
        "of them (leaf-02 is where they meet). Trace paths or run a pinned probe to narrow it down.",
    ]
    assert sections(env.page(capsys, "ties"))["Localization"][0].startswith("Localization (candidates by score")


def test_timeline_opens_once_and_updated_follows_the_ongoing_fault(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    inc = env.json(capsys, "demo")
    whats = [t["what"] for t in inc["timeline"]]
    assert [w.split(":", 1)[0] for w in whats] == ["first symptom", "opened"], whats
    opened = inc["timeline"][1]["ts"]
    # The fault runs to the end of the replay: the incident was confirmed within the last refresh
    # (30 s) of the last scrape (a settled moment may end up to one interval past it), minutes after
    # it opened.
    last = env.fleet.end_ts
    assert last - 30 <= inc["updated_ts"] <= last + DEMO.interval and inc["updated_ts"] - opened >= 120
    page = sections(env.page(capsys, "demo"))
    assert page["head"][2] == f"started {iso(inc['started_ts'])} · updated {iso(inc['updated_ts'])}"
    assert rows(page["Timeline"]) == [["at", "by", "what"]] + [
        [iso(t["ts"]), "detector", t["what"]] for t in inc["timeline"]
    ]


def test_counts_read_as_english(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    assert sections(env.page(capsys, "flap"))["Affected"] == [
        "Affected: 1 node, 1 node pair",
        "  nodes       node-003",
        "  node pairs  node-003 -> node-004",
    ]
    # The engine's own summary of a one-pair proposal (detect/base.py), from the shipped rtt rule.
    rule = next(r for r in load_rules().rules if r.name == "rtt_p99_outlier")
    pair = Finding(rule, "node-001", "node-002", "", (), T0, T0 + 20, 9.5, 9.5, True)
    other = Finding(rule, "node-003", "node-002", "", (), T0, T0 + 20, 7.0, 7.0, True)
    one = base.proposal(IncidentKind.TAIL_LATENCY, "node-002", None, [pair], "answers late")
    assert (
        one.summary == "node-002 answers late since 22:13 UTC, 1 node pair affected, rtt_p99_outlier at 9.5 on node-001"
    )
    two = base.proposal(IncidentKind.TAIL_LATENCY, "node-002", None, [pair, other], "answers late")
    assert ", 2 node pairs affected," in two.summary


def test_next_checks_per_kind_name_the_candidate_elements(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    demo = steps(sections(env.page(capsys, "demo"))["Next"])
    assert demo == [
        f"Read the switch-side counters of {DEMO_LINK}, on both ends: egress queue depth, ECN-marked and dropped "
        "packets, PFC pause frames sent and received. The hosts only see what reached them; the switch shows "
        "which queue holds the traffic.",
        "On leaf-02 and spine-01, check the ECN marking thresholds (Kmin/Kmax) and the PFC-enabled priority: "
        "they must match the hosts' RoCE traffic class.",
        f"Compare {DEMO_LINK} with its sibling uplinks: much more traffic on it than on them means the ECMP hash "
        "puts too many of the affected flows there (move or re-hash them); the same load everywhere means the "
        "fabric is simply oversubscribed.",
        # the replay's candidates: the link at 1.0, its sibling leaf-04~spine-01 at 0.2 (fabricd/next_checks.py,
        # FIRST_LOOK_SHARE): a next candidate, not a switch to read at once
        f"If {DEMO_LINK} is clean, the next candidates: leaf-04~spine-01.",
        f"The whole picture, with plots: fabricd report --incident {env.ids['demo']}",
    ]
    # leaf-01 at 0.5 and its uplinks at 0.25 (half of it): all three are first looks; leaf-02 at 0.125 is not
    assert steps(sections(env.page(capsys, "ties"))["Next"])[:2] == [
        "Read the switch-side counters of leaf-01~spine-01 and leaf-01~spine-02, on both ends: egress queue "
        "depth, ECN-marked and dropped packets, PFC pause frames sent and received. The hosts only see what "
        "reached them; the switch shows which queue holds the traffic.",
        "On leaf-01, spine-01 and spine-02, check the ECN marking thresholds (Kmin/Kmax) and the PFC-enabled "
        "priority: they must match the hosts' RoCE traffic class.",
    ]
    assert steps(sections(env.page(capsys, "flap"))["Next"])[:4] == [
        "Inspect the cable and transceivers of node-003/mlx5_1~leaf-01: reseat or replace them; read the optics "
        "on both ends (node-003/mlx5_1 and leaf-01) (ethtool -m or mlxlink -m: temperature, Rx/Tx power).",
        "Read the port error counters on both ends (node-003/mlx5_1 and leaf-01): symbol and CRC errors, link "
        "downed, link error recovery (the host end: fabricd ports --node node-003; the switch end: its port "
        "counters and log).",
        "Run a pinned probe between node-003 and node-004 (an affected pair), with a fixed source port so ECMP "
        "keeps it on this path: loss that follows the link confirms it.",
        "If node-003/mlx5_1~leaf-01 is clean, the next candidates: node-003/mlx5_1.",
    ]
    assert steps(sections(env.page(capsys, "storm"))["Next"])[:3] == [
        "Find why node-002/mlx5_0, the pause source port, pauses its link partner: on node-002, a receiver that "
        "cannot drain (NIC firmware, PCIe errors, a hung or starved process reading its queues).",
        "Check the PFC watchdog (storm prevention) on the switch port facing node-002/mlx5_0 and on the NIC "
        "(mlx5 tx_pause_storm counters): it should stop honouring pauses from a port that never stops.",
        "Once it stops, the paused ports should recover: node-001/mlx5_0.",
    ]
    assert steps(sections(env.page(capsys, "straggler"))["Next"])[:3] == [
        "Check node-004's GPUs: nvidia-smi -q (clocks, power and thermal throttling, ECC errors) and XID errors "
        "in its kernel log.",
        "Check node-004's NICs and PCIe: fabricd ports --node node-004 (link rate and errors against its peers), "
        "and each HCA's PCIe link width and speed (lspci -vv).",
        "Run a pinned NCCL test: all_reduce_perf on node-004 with one known-good node, then on that node with "
        "another good one; slow only with node-004 confirms it.",
    ]
    assert steps(sections(env.page(capsys, "tail"))["Next"])[:2] == [
        "Check host jitter on node-005: CPU load and steal, the NIC's interrupt affinity, power-saving C-states; "
        "a busy host answers probes late.",
        "Run a pinned probe between node-001 and node-005 (an affected pair), and one between two hosts away "
        "from node-005; compare their p99 RTT.",
    ]


def test_evidence_of_other_units_and_a_below_threshold_rule(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    assert rows(sections(env.page(capsys, "storm"))["Evidence"])[1:] == [
        ["rx_pause_ratio", "node-001/mlx5_0 priority=3", "80%", "> 20%", iso(T0 + 5)],
        ["tx_pause_ratio", "node-002/mlx5_0 priority=3", "90%", "> 50%", iso(T0 + 5)],
    ]
    assert rows(sections(env.page(capsys, "straggler"))["Evidence"])[1:] == [
        ["nccl_efficiency_sustained", "node-004/all_reduce", "40%", "< 60%", iso(T0 + 5)]
    ]
    assert rows(sections(env.page(capsys, "flap"))["Evidence"])[1:] == [
        ["link_downs_per_second", "node-003/mlx5_1/1", "0.2/s", "> 0/s", iso(T0 + 5)]
    ]
    assert rows(sections(env.page(capsys, "old"))["Evidence"])[1:] == [
        ["ecn_marked_ratio", "node-009/mlx5_0/1", "12%", "2%", iso(T0 + 5)]
    ]
