"""The InfiniBand fabric graph at the central (issue 16 §2): the ``ibfabric`` collector sends what
``ibnetdiscover`` found as ``cable_info`` readings, the central rebuilds the fabric from them,
merges it with what LLDP found, and flags what changed (``topology diff``, ``topology change``
events).

The fabric is a real capture (tests/cases/ibfabric/ibnetdiscover_topology_psmn_x5: ENS de Lyon's
X5 cluster, 11 switches, 89 CAs) and, for the change, the same capture with one cable moved by hand
(``..._recabled``, an edit labelled in tests/cases/ibfabric/ORIGIN.md). The end-to-end test runs a
real ``fabricd agent`` whose ``ibnetdiscover`` is a script on its PATH printing the capture, and a
real ``fabricd server``.
"""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from collectors.ibfabric import cable_readings
from fabricd.cli import main
from fabricd.model import Sample
from fabricd.parsers.ibnetdiscover import IbnetPort, parse_ibnetdiscover
from fabricd.topology import from_ibnetdiscover, ibnet, to_doc
from fabricd.topology.assemble import discovered, newest_scrape
from fabricd.topology.diff import diff
from fabricd.topology.document import from_doc
from tests.helpers import CASES
from tests.test_agent_acceptance import Agent, Central, Proc, procs, wait_for

__all__ = ["procs"]  # the fixture, imported for the end-to-end test

IB = CASES / "ibfabric"
PSMN = IB / "ibnetdiscover_topology_psmn_x5" / "input.txt"
RECABLED = IB / "ibnetdiscover_topology_psmn_x5_recabled" / "input.txt"
MOVED_CA = "MT25408-0x78e7d10300229795/ConnectX_Mellanox_Technologies"
INFINISCALE = "Infiniscale-IV_Mellanox_Technologies-0x0002c90200417670"
VOLTAIRE = "Voltaire_4036_-_36_QDR_ports_switch-0x0008f10500200b50"
RECABLED_CHANGE = {"kind": "recabled", "element": MOVED_CA, "detail": f"was on {INFINISCALE}, now on {VOLTAIRE}"}


def ports(path: Path) -> list[IbnetPort]:
    return parse_ibnetdiscover(path.read_text()).ports


def as_samples(node: str, ts: float, path: Path) -> list[tuple[str, Sample]]:
    return [(node, Sample(ts, r)) for r in cable_readings(ports(path))]


@pytest.mark.parametrize("case", ["ibnetdiscover_topology_psmn_x5", "ibnetdiscover_topology_rdma_core_man"])
def test_the_cable_readings_carry_the_whole_fabric(case: str) -> None:
    text = (IB / case / "input.txt").read_text()
    readings = cable_readings(parse_ibnetdiscover(text).ports)
    assert {r.name for r in readings} == {"cable_info"}
    rebuilt = ibnet.from_ports(ibnet.ports_from_readings(readings))
    assert to_doc(rebuilt) == to_doc(from_ibnetdiscover(text))


def test_one_reading_per_cabled_port_naming_both_ends() -> None:
    readings = cable_readings(ports(PSMN))
    assert len(readings) == 318  # the capture's connected-port lines (its ORIGIN.md)
    ca_side = [r for r in readings if dict(r.labels)["guid"] == "0x78e7d10300229795"]
    assert [(r.device, r.port, dict(r.labels)) for r in ca_side] == [
        (
            MOVED_CA,
            "1",
            {
                "guid": "0x78e7d10300229795",
                "type": "CA",
                "desc": "MT25408 ConnectX Mellanox Technologies",
                "width": "4x",
                "speed": "QDR",
                "remote_guid": "0x0002c90200417670",
                "remote_type": "SW",
                "remote_port": "1",
                "remote_desc": "Infiniscale-IV Mellanox Technologies",
            },
        )
    ]


def test_a_cable_listed_from_one_end_only_and_ends_that_disagree_are_problems() -> None:
    whole = ports(PSMN)
    assert ibnet.problems(whole) == []
    # Two sweeps mixed: the switches as before the move, the moved CA's own line as after it. The
    # Infiniscale still names the CA on its port 1; the CA names the Voltaire's port 25, which the
    # Voltaire does not list.
    mixed = [p for p in whole if p.local.guid != "0x78e7d10300229795"] + [
        p for p in ports(RECABLED) if p.local.guid == "0x78e7d10300229795"
    ]
    assert ibnet.problems(mixed) == [
        f"{MOVED_CA} port 1: {INFINISCALE} port 1 says it is cabled to it, {MOVED_CA} port 1 names "
        f"{VOLTAIRE} port 25 (ibnetdiscover)",
        f"{MOVED_CA} port 1 ~ {VOLTAIRE} port 25: seen from {MOVED_CA} only (ibnetdiscover)",
    ]


def test_a_disagreement_in_a_real_capture() -> None:
    # infiniband_exporter's test2.out: the aggregation node's CA port 1 names leaf-IB01 port 81,
    # while spine-IB03 port 81 names that CA port.
    assert ibnet.problems(ports(IB / "ibnetdiscover_test2" / "input.txt")) == [
        "Mellanox/Technologies_Aggregation_Node port 1: 5FB0406-spine-IB03 port 81 says it is cabled to it, "
        "Mellanox/Technologies_Aggregation_Node port 1 names 5FB0405-leaf-IB01 port 81 (ibnetdiscover)"
    ]


def test_the_newest_scrape_of_each_agent_is_the_fabric_now() -> None:
    stored = to_doc(from_ibnetdiscover(PSMN.read_text()))
    # the older scrape still holds the cable that moved: only the newest one counts
    samples = as_samples("sm-1", 100.0, PSMN) + as_samples("sm-1", 110.0, RECABLED)
    assert len(newest_scrape(samples)["sm-1"]) == 318
    found = discovered([], stored, ibfabric=samples)
    assert found.problems == []
    assert [(c.kind, c.element, c.detail) for c in found.changes] == [tuple(RECABLED_CHANGE.values())]
    assert found.document == to_doc(from_ibnetdiscover(RECABLED.read_text()))


def test_two_subnet_manager_hosts_seeing_one_fabric_give_it_once() -> None:
    samples = as_samples("sm-1", 100.0, PSMN) + as_samples("sm-2", 101.0, PSMN)
    found = discovered([], None, ibfabric=samples)
    assert found.document == to_doc(from_ibnetdiscover(PSMN.read_text()))
    assert found.problems == []


# --- end to end: a real agent with a fake ibnetdiscover on its PATH, a real central --------------


def _tools(bin_dir: Path, capture: Path) -> None:
    """``ibnetdiscover`` prints whatever ``capture`` holds now (the test swaps it); ``perfquery``
    fails as the real one does when a node does not answer (counters are not this test's subject)."""
    scripts = {
        "ibnetdiscover": f'#!/bin/sh\ncat "{capture}"\n',
        "perfquery": '#!/bin/sh\necho "ibwarn: [0] _do_madrpc: recv failed: $*" >&2\nexit 1\n',
    }
    for name, text in scripts.items():
        tool = bin_dir / name
        tool.write_text(text)
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


def _discovered(central: Central) -> dict[str, Any]:
    resp = httpx.get(f"{central.url}/api/v1/topology/discovered", timeout=10)
    resp.raise_for_status()
    return resp.json()  # type: ignore[no-any-return]


def _cli(capsys: pytest.CaptureFixture[str], central: Central, *args: str) -> tuple[int, str, str]:
    code = main(["topology", *args, "--server", central.url])
    out, err = capsys.readouterr()
    return code, out, err


def _changes(found: dict[str, Any]) -> list[dict[str, str]]:
    return found["changes"]  # type: ignore[no-any-return]


@pytest.mark.slow
def test_an_agent_running_ibnetdiscover_keeps_the_central_fabric_current(
    tmp_path: Path, procs: list[Proc], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir, capture = tmp_path / "bin", tmp_path / "capture.txt"
    bin_dir.mkdir()
    capture.write_text(PSMN.read_text())
    _tools(bin_dir, capture)
    central = Central(tmp_path)
    central.env = {"FABRICD_TOPOLOGY_WATCH_SECONDS": "0.5", "FABRICD_LOG_FORMAT": "json"}
    options = {
        "ibnetdiscover_command": ["ibnetdiscover"],  # the topology-file format, found on PATH
        "perfquery_errors_command": None,
        "rediscover_every": 1,
        "timeout_seconds": 5,
    }
    agent = Agent(
        tmp_path,
        central,
        node="sm-host",
        FABRICD_COLLECTORS=json.dumps({"ibfabric": options}),
        PATH=f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}",
    )
    procs += [central, agent]
    central.start()
    agent.start()

    fabric = from_ibnetdiscover(PSMN.read_text())
    wait_for("the agent's fabric at the central", lambda: _discovered(central)["document"] == to_doc(fabric))
    found = _discovered(central)
    assert found["problems"] == []
    everything_new = [{"kind": c.kind, "element": c.element, "detail": c.detail} for c in diff(from_doc({}), fabric)]
    assert _changes(found) == everything_new
    assert len(everything_new) == 11 + 89 + len(fabric.links)  # switches, hosts (one per CA), links
    # The watch logs what it saw every 0.5 s; a push before its next tick would make the new fabric
    # "no change" unseen (CI, loaded: only the later move was logged). Wait for it, then push.
    wait_for("the new fabric's change events", lambda: len(_events(central)) >= len(everything_new))

    # The operator stores it, as docs/topology.md says: discover --central | push -
    code, out, err = _cli(capsys, central, "discover", "--central")
    assert (code, err) == (0, "")
    monkeypatch.setattr("sys.stdin", io.StringIO(out))
    elements = len(fabric.switches) + len(fabric.hca_ports)
    assert _cli(capsys, central, "push", "-") == (
        0,
        f"topology stored: {elements} elements, {len(fabric.links)} links\n",
        "",
    )
    assert _cli(capsys, central, "diff") == (0, "no change\n", "")

    # A cable moves: the next ibnetdiscover run sees the CA on the Voltaire's port 25.
    capture.write_text(RECABLED.read_text())
    wait_for("the moved cable at the central", lambda: _changes(_discovered(central)) == [RECABLED_CHANGE])
    code, out, _ = _cli(capsys, central, "diff", "--json")
    assert (code, json.loads(out)) == (0, [RECABLED_CHANGE])
    wait_for("the topology change event", lambda: _events(central).count(RECABLED_CHANGE) == 1)
    agent.term()
    central.term()
    events = _events(central)
    # each change logged once, when it appeared: everything new before the push, then the move
    assert sorted(events, key=_key) == sorted([*everything_new, RECABLED_CHANGE], key=_key)


def _events(central: Central) -> list[dict[str, str]]:
    out = []
    for line in central.text().splitlines():
        if '"topology change"' in line:
            e = json.loads(line)
            out.append({"kind": e["kind"], "element": e["element"], "detail": e["detail"]})
    return out


def _key(change: dict[str, str]) -> tuple[str, str, str]:
    return (change["kind"], change["element"], change["detail"])


IBSIM = IB / "ibnetdiscover_ibsim_leafspine" / "input.txt"
IBSIM_DOWN = IB / "ibnetdiscover_ibsim_leafspine_link_down" / "input.txt"
TRACES = CASES / "ibtracert"


def _ibsim_tools(bin_dir: Path, fabric: Path, trace_2_8: Path) -> None:
    """ibnetdiscover and ibtracert answering with the ibsim captures of one state of the fabric."""
    back = TRACES / "ibsim_8_2_back" / "input.txt"
    scripts = {
        "ibnetdiscover": f'#!/bin/sh\ncat "{fabric}"\n',
        "ibtracert": (
            f'#!/bin/sh\ncase "$*" in\n  "2 8") cat "{trace_2_8}" ;;\n  "8 2") cat "{back}" ;;\n'
            '  *) echo "ibwarn: [0] mad_rpc: _do_madrpc failed; dport ($*)" >&2; exit 255 ;;\nesac\n'
        ),
        "perfquery": '#!/bin/sh\necho "ibwarn: [0] _do_madrpc: recv failed: $*" >&2\nexit 1\n',
    }
    for name, text in scripts.items():
        tool = bin_dir / name
        tool.write_text(text)
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


@pytest.mark.slow
def test_traced_paths_reach_the_central_as_routes_and_a_dead_cable_moves_them(
    tmp_path: Path, procs: list[Proc], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _ibsim_tools(bin_dir, IBSIM, TRACES / "ibsim_2_8_via_spine2" / "input.txt")
    central = Central(tmp_path)
    central.env = {"FABRICD_TOPOLOGY_WATCH_SECONDS": "0.5", "FABRICD_LOG_FORMAT": "json"}
    options = {"rediscover_every": 1, "perfquery_errors_command": None, "trace_nodes": ["gpu-a01", "gpu-b02"]}
    agent = Agent(
        tmp_path,
        central,
        node="sm-host",
        FABRICD_COLLECTORS=json.dumps({"ibfabric": options}),
        PATH=f"{bin_dir}:/usr/bin:/bin",
    )
    procs += [central, agent]
    central.start()
    agent.start()
    fabric = from_ibnetdiscover(IBSIM.read_text())
    spine2 = ["gpu-a01/mlx5_0~ib-leaf-1", "ib-leaf-1~ib-spine-2", "ib-leaf-2~ib-spine-2", "gpu-b02/mlx5_0~ib-leaf-2"]
    back = ["gpu-b02/mlx5_0~ib-leaf-2", "ib-leaf-2~ib-spine-1", "ib-leaf-1~ib-spine-1", "gpu-a01/mlx5_0~ib-leaf-1"]
    wait_for("the fabric", lambda: _discovered(central)["document"] == to_doc(fabric))

    # The operator stores the fabric once; the traced paths join it by themselves.
    code, out, err = _cli(capsys, central, "discover", "--central")
    assert (code, err) == (0, "")
    monkeypatch.setattr("sys.stdin", io.StringIO(out))
    assert _cli(capsys, central, "push", "-")[0] == 0
    wait_for(
        "the traced routes", lambda: _routes(central) == {("gpu-a01", "gpu-b02"): spine2, ("gpu-b02", "gpu-a01"): back}
    )

    # The spine-2 - leaf-2 cable goes down; the SM sweeps; the tools now show the new fabric.
    _ibsim_tools(bin_dir, IBSIM_DOWN, TRACES / "ibsim_2_8_rerouted" / "input.txt")
    gone = {"kind": "link_removed", "element": "ib-leaf-2~ib-spine-2", "detail": "8-2"}
    wait_for("the dead cable at the central", lambda: _changes(_discovered(central)) == [gone])
    rerouted = [e.replace("spine-2", "spine-1") for e in spine2]
    wait_for("the route off the dead cable", lambda: _routes(central)[("gpu-a01", "gpu-b02")] == rerouted)
    assert _routes(central) == {("gpu-a01", "gpu-b02"): rerouted, ("gpu-b02", "gpu-a01"): back}
    wait_for("the topology change event", lambda: gone in _events(central))


def _routes(central: Central) -> dict[tuple[str, str], list[str]]:
    """The traced routes of what detection reads (GET /api/v1/topology: the stored document with
    the agents' traced paths merged in)."""
    doc = httpx.get(f"{central.url}/api/v1/topology", timeout=10).json()
    return {(r["src"], r["dst"]): r["elements"] for r in doc["routes"] if r.get("source") == "trace"}
