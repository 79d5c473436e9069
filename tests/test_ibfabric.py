"""ibfabric: the perfquery / ibnetdiscover / ibstat parsers on every captured output (case folders),
the collector running real subprocesses (fake tools that replay the captures), and the topology model."""

from __future__ import annotations

import json
import os
import shlex
import stat
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from collectors.ibfabric import (
    IbFabricCollector,
    IbFabricFactories,
    IbFabricOptions,
    block_readings,
    fabric_targets,
    status_readings,
)
from fabricd.collector import CollectorConfigError, CollectorContext, build
from fabricd.command import SubprocessRunner
from fabricd.model import Reading
from fabricd.parsers.ibnetdiscover import parse_ibnetdiscover
from fabricd.parsers.ibstat import parse_ibstat, parse_ibstatus
from fabricd.parsers.perfquery import parse_perfquery
from fabricd.topology import fat_tree, from_ibnetdiscover, from_yaml
from tests.helpers import CASES

IB_CASES = sorted(p for p in (CASES / "ibfabric").iterdir() if p.is_dir())
UPDATE = os.environ.get("UPDATE_GOLDEN", "") == "1"


def command(case: Path) -> list[str]:
    return shlex.split((case / "command.txt").read_text())


def readings_json(readings: list[Reading]) -> list[dict[str, Any]]:
    return [{**r.to_json(), "width": r.width, "saturates": r.saturates} for r in readings]


def case_result(case: Path) -> dict[str, Any]:
    argv, text = command(case), (case / "input.txt").read_text()
    if argv[0] == "perfquery":
        blocks = parse_perfquery(text)
        guid = argv[argv.index("-G") + 1]
        return {
            "blocks": [asdict(b) for b in blocks],
            "readings": readings_json([r for b in blocks for r in block_readings(guid, b, ())]),
        }
    if argv[0] == "ibnetdiscover":
        topo = from_ibnetdiscover(text)
        return {
            "ports": [asdict(p) for p in parse_ibnetdiscover(text).ports],
            "problems": [asdict(p) for p in parse_ibnetdiscover(text).problems],
            "switches": {s.id: s.tier for s in topo.switches.values()},
            # cables as IB port numbers (the topology keeps port names: a number here, "swp3" from LLDP)
            "links": {link.id: [[int(x) for x in p] for p in link.ports] for link in topo.links.values()},
        }
    if argv[0] == "ibstat":
        result = parse_ibstat(text)
        return {
            "ports": [asdict(p) for p in result.ports],
            "errors": result.errors,
            "readings": readings_json([r for p in result.ports for r in status_readings(p)]),
        }
    ports = parse_ibstatus(text)
    return {
        "ports": [asdict(p) for p in ports],
        "readings": readings_json([r for p in ports for r in status_readings(p)]),
    }


@pytest.mark.parametrize("case", IB_CASES, ids=[p.name for p in IB_CASES])
def test_case_matches_expected(case: Path) -> None:
    got = case_result(case)
    if UPDATE:
        (case / "expected.json").write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads((case / "expected.json").read_text())


def expected(name: str) -> dict[str, Any]:
    return dict(json.loads((CASES / "ibfabric" / name / "expected.json").read_text()))


def reading(name: str, port: str, counter: str) -> dict[str, Any]:
    return next(r for r in expected(name)["readings"] if r["port"] == port and r["counter"] == counter)


def test_data_counters_are_bytes_and_error_widths_follow_capmask2() -> None:
    xmit = reading("perfquery_x_0x7cfe9003009ce5b0", "1", "PortXmitData")
    assert (xmit["name"], xmit["value"], xmit["unit"]) == ("port_transmit_data", 36298026860928 * 4, "bytes")
    # Switch with CapMask2 0x2: 64-bit extended error counters. HCA with CapMask2 0: PortCounters.
    assert reading("perfquery_x_0x7cfe9003009ce5b0", "1", "SymbolErrorCounter")["width"] == 64
    hca = reading("perfquery_x_0x7cfe9003003b4bde", "1", "SymbolErrorCounter")
    assert (hca["width"], hca["saturates"]) == (16, True)
    assert reading("perfquery_x_0x506b4b03005c2740", "1", "PortXmitDiscards")["value"] == 20046
    assert reading("perfquery_x_0x506b4b03005c2740", "1", "LinkDownedCounter")["value"] == 1
    assert expected("perfquery_x_0x506b4b0300cc02a6_empty")["readings"] == []
    detail = reading("perfquery_E_0x7cfe9003009ce5b0_2", "2", "PortBufferOverrunErrors")
    assert (detail["name"], detail["width"], detail["saturates"]) == ("port_buffer_overrun_errors", 16, True)


def test_ibstat_reports_down_ports_and_the_panic() -> None:
    down = expected("gpud_ibstat_47_0_h100_some_down_0")
    states = {(p["device"], p["state"]) for p in down["ports"]}
    assert ("mlx5_0", "Active") in states and any(s == "Down" for _, s in states)
    assert all(p["state_id"] == 1 for p in down["ports"] if p["state"] == "Down")
    failed = expected("gpud_ibstat_39_0_a100_failed_ibpanic_exit-255_0")
    assert len(failed["ports"]) == 8 and "mlx5_8" in failed["errors"][0]
    ibstatus = expected("gpud_ibstatus_39_0_a100_all_active_0")
    rate = next(r for r in ibstatus["readings"] if r["counter"] == "rate")
    assert rate["value"] == 200 * 125_000_000 and ibstatus["ports"][0]["state_id"] == 4


def test_ibnetdiscover_keeps_unconnected_ports_and_trims_descriptions() -> None:
    ports = expected("ibnetdiscover_test")["ports"]
    unconnected = [p for p in ports if p["remote"] is None]
    assert {(p["local"]["desc"], p["speed"]) for p in unconnected} == {("ib-i4l1s01", "???"), ("ib-i7l2s01", "SDR")}
    assert "5FB0406-spine-IB02" in expected("ibnetdiscover_test2")["switches"]
    assert expected("ibnetdiscover_test3")["switches"] == {"Infiniscale-IV_Mellanox_Technologies": "spine"}


# --- the collector with real subprocesses ------------------------------------------------------


def fake_tool(
    bin_dir: Path,
    name: str,
    replies: dict[str, Path],
    *,
    sleep: dict[str, float] | None = None,
    log: Path | None = None,
) -> Path:
    """An executable ``name`` that answers the argument line ``$*`` with ``cat`` of a capture (and may
    sleep first); any other line fails the way the real tools do when a node does not answer."""
    lines = ["#!/bin/sh", f'echo start >> "{log}"' if log else ":", 'case "$*" in']
    for args, path in replies.items():
        pause = f"sleep {sleep[args]}; " if sleep and args in sleep else ""
        lines.append(f"  {shlex.quote(args)}) {pause}cat {shlex.quote(str(path))} ;;")
    lines += ['  *) echo "ibwarn: [0] _do_madrpc: recv failed: $*" >&2; status=1 ;;', "esac"]
    lines += [f'echo end >> "{log}"' if log else ":", 'exit "${status:-0}"']
    tool = bin_dir / name
    tool.write_text("\n".join(lines) + "\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool


def replies_for(tool: str, *, topology: str = "ibnetdiscover_test") -> dict[str, Path]:
    out = {}
    for case in IB_CASES:
        argv = command(case)
        if argv[0] == tool and (tool != "ibnetdiscover" or case.name == topology):
            out[" ".join(argv[1:])] = case / "input.txt"
    return out


def make(bin_dir: Path, **options: Any) -> IbFabricCollector:
    defaults: dict[str, Any] = {
        "ibnetdiscover_command": [str(bin_dir / "ibnetdiscover"), "-p"],
        "perfquery_command": [str(bin_dir / "perfquery"), "-x", "-l", "-G", "{guid}"],
        "perfquery_errors_command": [str(bin_dir / "perfquery"), "-E", "-G", "{guid}", "{port}"],
    }
    ctx = CollectorContext(
        "mgmt-01",
        options=IbFabricOptions(**{**defaults, **options}),
        factories=(IbFabricFactories(runner=SubprocessRunner),),
    )
    return IbFabricCollector(ctx)


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    fake_tool(tmp_path, "ibnetdiscover", replies_for("ibnetdiscover"))
    fake_tool(tmp_path, "perfquery", replies_for("perfquery"))
    return tmp_path


async def test_switch_ports_carry_counters_and_the_far_end_of_their_cable(bin_dir: Path) -> None:
    readings = await make(bin_dir).collect()
    by_key = {(r.device, r.port, r.counter): r for r in readings}
    uplink = by_key[("ib-i1l1s01", "1", "PortXmitData")]
    assert uplink.value == 36298026860928 * 4 and uplink.metric == "port_transmit_data"
    assert dict(uplink.labels) == {"remote": "ib-i1l2s01", "remote_port": "1", "remote_type": "SW"}
    assert by_key[("ib-i1l1s01", "2", "PortXmitWait")].labels == ()  # port 2 is not cabled
    assert by_key[("ib-i4l1s01", "1", "PortXmitDiscards")].value == 20046
    detail = by_key[("ib-i1l1s01", "1", "PortLocalPhysicalErrors")]  # perfquery -E on the cabled port
    assert dict(detail.labels)["remote"] == "ib-i1l2s01"
    counters = [r for r in readings if r.name != "cable_info"]
    assert {r.device for r in counters} == {"ib-i1l1s01", "ib-i4l1s01"}  # ib-i7l2s01 did not answer
    cables = {(r.device, r.port) for r in readings if r.name == "cable_info"}  # every cabled port line
    assert cables == {
        ("o0001/HCA-1", "1"),
        ("o0002/HCA-1", "1"),
        ("p0001/HCA-1", "1"),
        ("ib-i1l1s01", "10"),
        ("ib-i1l1s01", "11"),
        ("ib-i1l1s01", "1"),
        ("ib-i4l1s01", "35"),
    }


# An ibqueryerrors --details reply for the ibnetdiscover_test fabric, in the format of
# tests/cases/ibqueryerrors/ (ibqueryerrors.c print_results); its GUIDs are that fabric's.
IBQUERYERRORS_REPLY = """Errors for 0x7cfe9003009ce5b0 "ib-i1l1s01"
   GUID 0x7cfe9003009ce5b0 port ALL: [PortRcvErrors == 7 (7.000)]
   GUID 0x7cfe9003009ce5b0 port 1: [PortRcvErrors == 7 (7.000)] [PortLocalPhysicalErrors == 6] [PortMalformedPktErrors == 1]

## Summary: 6 nodes checked, 1 bad nodes found
##          40 ports checked, 1 ports have errors beyond threshold
## Thresholds:
## Suppressed:
"""


async def test_one_ibqueryerrors_run_replaces_perfquery_per_port(bin_dir: Path, tmp_path: Path) -> None:
    reply = tmp_path / "ibqueryerrors.txt"
    reply.write_text(IBQUERYERRORS_REPLY)
    calls = tmp_path / "perfquery.log"
    fake_tool(bin_dir, "perfquery", replies_for("perfquery"), log=calls)
    fake_tool(bin_dir, "ibqueryerrors", {"--details": reply})
    collector = make(bin_dir, ibqueryerrors_command=[str(bin_dir / "ibqueryerrors"), "--details"])
    readings = await collector.collect()
    by_key = {(r.device, r.port, r.counter): r for r in readings}
    detail = by_key[("ib-i1l1s01", "1", "PortLocalPhysicalErrors")]
    assert (detail.value, detail.name, detail.width, detail.saturates) == (6.0, "port_local_physical_errors", 16, True)
    assert dict(detail.labels) == {"remote": "ib-i1l2s01", "remote_port": "1", "remote_type": "SW"}
    assert by_key[("ib-i1l1s01", "1", "PortMalformedPktErrors")].value == 1.0
    # PortRcvErrors comes from perfquery -x alone (one source per series), and only the 3 switches'
    # perfquery -x ran: no perfquery -E per cabled port.
    assert [r.value for r in readings if (r.device, r.port, r.counter) == ("ib-i1l1s01", "1", "PortRcvErrors")] == [0.0]
    assert calls.read_text().split().count("start") == 3


async def test_hca_ports_on_request_name_the_switch_port_they_face(bin_dir: Path) -> None:
    readings = await make(bin_dir, include_hcas=True, perfquery_errors_command=None).collect()
    hca = next(r for r in readings if r.device == "o0001/HCA-1" and r.counter == "PortRcvData")
    assert dict(hca.labels) == {"remote": "ib-i1l1s01", "remote_port": "10", "remote_type": "SW"}
    # its perfquery reply was empty: only its cable is reported
    assert [r.name for r in readings if r.device == "p0001/HCA-1"] == ["cable_info"]


async def test_a_hung_switch_times_out_without_hiding_the_others(tmp_path: Path) -> None:
    replies = replies_for("perfquery")
    fake_tool(tmp_path, "ibnetdiscover", replies_for("ibnetdiscover"))
    fake_tool(tmp_path, "perfquery", replies, sleep={"-x -l -G 0x506b4b03005c2740": 30})
    readings = await make(tmp_path, timeout_seconds=1.0, perfquery_errors_command=None, report_cables=False).collect()
    assert {r.device for r in readings} == {"ib-i1l1s01"}


async def test_concurrency_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    replies = replies_for("perfquery")
    fake_tool(tmp_path, "ibnetdiscover", replies_for("ibnetdiscover"))
    fake_tool(tmp_path, "perfquery", replies, sleep=dict.fromkeys(replies, 0.5), log=log)
    await make(tmp_path, concurrency=2, include_hcas=True, perfquery_errors_command=None).collect()
    in_flight, peak = 0, 0
    for line in log.read_text().split():
        in_flight += 1 if line == "start" else -1
        peak = max(peak, in_flight)
    assert log.read_text().count("start") == 6  # 3 switches + 3 HCAs, one perfquery each
    assert peak == 2


async def test_topology_failures(tmp_path: Path) -> None:
    fake_tool(tmp_path, "perfquery", replies_for("perfquery"))
    fake_tool(tmp_path, "ibnetdiscover", {})  # no fabric answers
    with pytest.raises(RuntimeError, match="ibnetdiscover found no fabric"):
        await make(tmp_path).collect()
    coll = make(tmp_path, rediscover_every=1, perfquery_errors_command=None)
    fake_tool(tmp_path, "ibnetdiscover", replies_for("ibnetdiscover"))
    first = await coll.collect()
    fake_tool(tmp_path, "ibnetdiscover", {})  # the SM went away: keep the last known topology
    second = await coll.collect()
    assert {r.key() for r in first} == {r.key() for r in second} != set()


async def test_local_ibstat_gives_port_state_even_when_ibstat_panics(tmp_path: Path) -> None:
    failed = CASES / "ibfabric" / "gpud_ibstat_39_0_a100_failed_ibpanic_exit-255_0" / "input.txt"
    fake_tool(tmp_path, "ibnetdiscover", replies_for("ibnetdiscover"))
    fake_tool(tmp_path, "perfquery", replies_for("perfquery"))
    fake_tool(tmp_path, "ibstat", {"": failed})
    readings = await make(tmp_path, ibstat_command=[str(tmp_path / "ibstat")]).collect()
    states = [r for r in readings if r.metric == "port_state"]
    assert len(states) == 8 and {r.value for r in states} == {4.0}


def test_commands_must_name_the_guid() -> None:
    registry = {"ibfabric": "collectors.ibfabric:IbFabricCollector"}
    with pytest.raises(CollectorConfigError, match=r"collectors\.ibfabric\.perfquery_command"):
        build(
            "ibfabric", {"perfquery_command": ["perfquery", "-x"]}, node="m", sysfs_root=Path("/sys"), registry=registry
        )


# --- the topology model ------------------------------------------------------------------------


def test_the_topology_file_gives_the_collector_its_switches_and_their_cabled_ports() -> None:
    # The rdma-core man-page example (topology-file format): what the collector queries, by hand.
    text = (CASES / "ibfabric" / "ibnetdiscover_topology_rdma_core_man" / "input.txt").read_text()
    targets = fabric_targets(parse_ibnetdiscover(text).ports, include_hcas=False)
    assert [(t.guid, t.device, sorted(t.ports)) for t in targets] == [
        ("0x0008f10400410015", "SW-6IB4_Voltaire", [1, 3, 4, 6]),
        ("0x005442ba00003080", "ISR9024_Voltaire", [6, 8, 10, 12, 22]),
    ]


def test_fat_tree_ids_and_ecmp_paths_over_spines() -> None:
    topo = fat_tree(nodes=16, hcas_per_node=2, nodes_per_leaf=8, spines=4, link_layer="ethernet")
    assert {"node-007", "node-007/mlx5_1", "node-007/mlx5_1~leaf-01", "leaf-01~spine-02", "leaf-02"} <= topo.elements()
    assert len(topo.switches) == 6 and len(topo.links) == 16 * 2 + 2 * 4
    far = topo.paths("node-001", "node-009")  # different leaves: one path per spine per HCA rail
    assert len(far) == 2 * 4
    assert all({"node-001", "node-009", "leaf-01", "leaf-02"} <= p for p in far)
    assert {s for p in far for s in p if s.startswith("spine-")} == {f"spine-0{i}" for i in range(1, 5)}
    via = next(p for p in far if "spine-03" in p and "node-001/mlx5_0" in p)
    assert {"node-001/mlx5_0~leaf-01", "leaf-01~spine-03", "leaf-02~spine-03", "node-009/mlx5_0~leaf-02"} <= via
    near = topo.paths("node-001", "node-002")  # same leaf: no spine at all
    assert len(near) == 2 and not any(s.startswith("spine-") for p in near for s in p)
    assert topo.paths("node-003", "node-003") == []


def test_ibnetdiscover_topology_and_paths() -> None:
    text = (CASES / "ibfabric" / "ibnetdiscover_test" / "input.txt").read_text()
    topo = from_ibnetdiscover(text)
    assert topo.switches["ib-i1l1s01"].tier == "leaf" and topo.switches["ib-i1l2s01"].tier == "spine"
    assert topo.links["o0001/HCA-1~ib-i1l1s01"].ports == (("1", "10"),)
    assert topo.paths("o0001", "o0002") == [
        frozenset(
            {
                "o0001",
                "o0001/HCA-1",
                "o0001/HCA-1~ib-i1l1s01",
                "ib-i1l1s01",
                "o0002",
                "o0002/HCA-1",
                "o0002/HCA-1~ib-i1l1s01",
            }
        )
    ]
    assert topo.paths("o0001", "p0001") == []  # the captured fragment does not join the two leaves


def test_yaml_topologies(tmp_path: Path) -> None:
    (tmp_path / "ft.yaml").write_text(
        "link_layer: ethernet\nfat_tree: {nodes: 4, hcas_per_node: 1, nodes_per_leaf: 2, spines: 2}\n"
    )
    assert from_yaml(tmp_path / "ft.yaml").elements() == fat_tree(4, 1, 2, 2, "ethernet").elements()
    (tmp_path / "x.yaml").write_text(
        "switches: [{id: leaf-01}, {id: leaf-02}, {id: spine-01, tier: spine}]\n"
        "nodes: [{id: node-001, hcas: [mlx5_0]}, {id: node-002, hcas: [mlx5_0]}]\n"
        "links: [{a: node-001/mlx5_0, b: leaf-01}, {a: node-002/mlx5_0, b: leaf-02},\n"
        "        {a: spine-01, b: leaf-01}, {a: leaf-02, b: spine-01}]\n"
    )
    topo = from_yaml(tmp_path / "x.yaml")
    assert set(topo.links) == {
        "node-001/mlx5_0~leaf-01",
        "node-002/mlx5_0~leaf-02",
        "leaf-01~spine-01",
        "leaf-02~spine-01",
    }
    assert len(topo.paths("node-001", "node-002")) == 1
    (tmp_path / "bad.yaml").write_text("links: [{a: node-9/mlx5_0, b: leaf-01}]\n")
    with pytest.raises(ValueError, match="unknown end"):
        from_yaml(tmp_path / "bad.yaml")
