"""ibtracert paths as routes (issue 16 §4): the ibfabric collector traces the configured hosts'
HCA pairs between their LIDs, a few a scrape, again after each rediscovery, and reports each path
once (``path_info``, the record the pingmesh traces use); the central places its GUID hops on the
topology (fabricd.topology.traced) as the links the localizer votes over.

The tools are scripts answering with real captures (tests/cases/ibtracert/ORIGIN.md: infiniband-diags
44.0 and opensm 3.3.23 on an ibsim fabric of 2 leaves x 2 spines, before and after its spine-2 -
leaf-2 cable went down), so the LIDs, GUIDs and ports are the ones the real tools printed together.
"""

from __future__ import annotations

import shlex
import stat
from pathlib import Path

import pytest

from collectors.ibfabric import IbFabricCollector, IbFabricFactories, IbFabricOptions
from fabricd.collector import CollectorConfigError, CollectorContext, build
from fabricd.command import SubprocessRunner
from fabricd.detect.localize import Localizer
from fabricd.ibtracing import path_reading
from fabricd.model import Reading, Sample
from fabricd.server.pathreports import parse_path
from fabricd.topology import Topology, from_ibnetdiscover, to_doc
from fabricd.topology.traced import Trace, address_owners, traced_routes
from tests.helpers import CASES

IB, TRACES = CASES / "ibfabric", CASES / "ibtracert"
FABRIC = IB / "ibnetdiscover_ibsim_leafspine" / "input.txt"
FABRIC_DOWN = IB / "ibnetdiscover_ibsim_leafspine_link_down" / "input.txt"
VIA_SPINE2 = [  # gpu-a01 -> gpu-b02 as leaf-1's forwarding table sends it (port 8: spine-2)
    "gpu-a01/mlx5_0~ib-leaf-1",
    "ib-leaf-1~ib-spine-2",
    "ib-leaf-2~ib-spine-2",
    "gpu-b02/mlx5_0~ib-leaf-2",
]
VIA_SPINE1 = [e.replace("spine-2", "spine-1") for e in VIA_SPINE2]
BACK = ["gpu-b02/mlx5_0~ib-leaf-2", "ib-leaf-2~ib-spine-1", "ib-leaf-1~ib-spine-1", "gpu-a01/mlx5_0~ib-leaf-1"]


def tool(bin_dir: Path, name: str, replies: dict[str, tuple[Path, int]]) -> None:
    """``name`` answers its argument line with a capture and that capture's exit status; any other
    line fails as the real tools do for a LID nobody answers."""
    lines = ["#!/bin/sh", 'case "$*" in']
    for args, (path, status) in replies.items():
        lines.append(f"  {shlex.quote(args)}) cat {shlex.quote(str(path))}; exit {status} ;;")
    lines += ['  *) echo "ibwarn: [0] mad_rpc: _do_madrpc failed; dport ($*)" >&2; exit 255 ;;', "esac"]
    path = bin_dir / name
    path.write_text("\n".join(lines) + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def tools(bin_dir: Path, *, down: bool = False) -> None:
    tool(bin_dir, "ibnetdiscover", {"-p": (FABRIC_DOWN if down else FABRIC, 0)})
    tool(bin_dir, "perfquery", {})
    trace_2_8 = TRACES / ("ibsim_2_8_rerouted" if down else "ibsim_2_8_via_spine2") / "input.txt"
    tool(bin_dir, "ibtracert", {"2 8": (trace_2_8, 0), "8 2": (TRACES / "ibsim_8_2_back" / "input.txt", 0)})


def collector(bin_dir: Path, **options: object) -> IbFabricCollector:
    settings = {
        "ibnetdiscover_command": [str(bin_dir / "ibnetdiscover"), "-p"],
        "perfquery_command": [str(bin_dir / "perfquery"), "-x", "-l", "-G", "{guid}"],
        "perfquery_errors_command": None,
        "ibtracert_command": [str(bin_dir / "ibtracert"), "{src_lid}", "{dst_lid}"],
        "trace_nodes": ["gpu-a01", "gpu-b02"],
        **options,
    }
    ctx = CollectorContext(
        "sm-host", options=IbFabricOptions(**settings), factories=(IbFabricFactories(SubprocessRunner),)
    )
    return IbFabricCollector(ctx)


def routes(readings: list[Reading]) -> list[tuple[str, dict[str, str]]]:
    return sorted((r.device, dict(r.labels)) for r in readings if r.name == "path_info")


def routes_from_readings(topo: Topology, readings: list[Reading]) -> dict[tuple[str, str], list[str]]:
    """What the central makes of the readings: ingest's parse_path, then the traced routes that
    RoutedTopology merges into what detection reads (fabricd/server/routed_topology.py)."""
    reports = [parse_path("sm-host", Sample(1.0, r)) for r in readings if r.name == "path_info"]
    traces = [Trace(p.node, p.peer, p.src, p.dst, p.hops, p.ts) for p in reports]
    owners = address_owners(to_doc(topo), [], traces)
    return {(t.src, t.dst): t.elements for t in traced_routes(topo, traces, owners)}


A01_GUID, B02_GUID = "0x0000000000100001", "0x0000000000100007"  # their port GUIDs


async def test_pairs_are_traced_a_few_a_scrape_each_reported_once(tmp_path: Path) -> None:
    tools(tmp_path)
    coll = collector(tmp_path, trace_pairs_per_scrape=1)
    first = routes(list(await coll.collect()))
    second = routes(list(await coll.collect()))
    a01_to_b02 = (
        "gpu-b02",
        {
            "src_node": "gpu-a01",
            "src": A01_GUID,
            "dst": B02_GUID,
            "hops": f"0x0000000000200000 0x0000000000200003 0x0000000000200001 {B02_GUID}",
            "reached": "true",
            "reason": "sweep",
        },
    )
    b02_to_a01 = (
        "gpu-a01",
        {
            "src_node": "gpu-b02",
            "src": B02_GUID,
            "dst": A01_GUID,
            "hops": f"0x0000000000200001 0x0000000000200002 0x0000000000200000 {A01_GUID}",
            "reached": "true",
            "reason": "sweep",
        },
    )
    assert first == [a01_to_b02]  # one trace this scrape (trace_pairs_per_scrape)
    assert second == [b02_to_a01]  # the next one; each path is reported once
    assert routes(list(await coll.collect())) == []  # nothing left to trace until the next discovery


async def test_a_new_sweep_retraces_and_the_route_moves_off_the_dead_cable(tmp_path: Path) -> None:
    tools(tmp_path)
    coll = collector(tmp_path, rediscover_every=1)
    before = list(await coll.collect())
    tools(tmp_path, down=True)  # the spine-2 - leaf-2 cable went down and the SM swept again
    after = list(await coll.collect())
    topo, topo_down = from_ibnetdiscover(FABRIC.read_text()), from_ibnetdiscover(FABRIC_DOWN.read_text())
    assert routes_from_readings(topo, before) == {("gpu-a01", "gpu-b02"): VIA_SPINE2, ("gpu-b02", "gpu-a01"): BACK}
    assert routes_from_readings(topo_down, after) == {("gpu-a01", "gpu-b02"): VIA_SPINE1, ("gpu-b02", "gpu-a01"): BACK}


async def test_a_failed_trace_gives_no_route_and_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tools(tmp_path)
    tool(tmp_path, "ibtracert", {"2 8": (TRACES / "ibsim_2_8_link_down" / "input.txt", 255)})
    readings = list(await collector(tmp_path).collect())
    assert routes(readings) == []
    assert sorted(r.getMessage() for r in caplog.records if "ibtracert" in r.getMessage()) == [
        "ibfabric: ibtracert gpu-a01/mlx5_0 -> gpu-b02/mlx5_0: no path: ibtracert: iberror: failed: Failed to get route information",
        "ibfabric: ibtracert gpu-b02/mlx5_0 -> gpu-a01/mlx5_0: no path: ibwarn: mad_rpc: _do_madrpc failed; dport (8 2)",
    ]


SPINE2_HOPS = ["0x0000000000200000", "0x0000000000200003", "0x0000000000200001", B02_GUID]


def test_routes_are_what_the_localizer_follows() -> None:
    topo = from_ibnetdiscover(FABRIC.read_text())
    static = [path_reading("gpu-a01", "gpu-b02", A01_GUID, B02_GUID, SPINE2_HOPS, "sweep")]
    traced = Localizer(topo, routes_from_readings(topo, static)).pair_paths("gpu-a01", "gpu-b02")
    ends = {"gpu-a01", "gpu-a01/mlx5_0", "ib-leaf-1", "ib-spine-2", "ib-leaf-2", "gpu-b02/mlx5_0", "gpu-b02"}
    assert [sorted(p) for p in traced] == [sorted(ends | set(VIA_SPINE2))]


async def test_with_adaptive_routing_pairs_have_no_single_path_and_keep_every_candidate(tmp_path: Path) -> None:
    tools(tmp_path)
    readings = list(await collector(tmp_path, adaptive_routing=True).collect())
    assert [(device, labels["hops"], labels["reason"]) for device, labels in routes(readings)] == [
        ("gpu-a01", "", "adaptive"),
        ("gpu-b02", "", "adaptive"),
    ]
    topo = from_ibnetdiscover(FABRIC.read_text())
    assert routes_from_readings(topo, readings) == {}
    candidates = Localizer(topo, None).pair_paths("gpu-a01", "gpu-b02")
    spines = sorted(next(e for e in p if e.startswith("ib-spine")) for p in candidates)
    assert spines == ["ib-spine-1", "ib-spine-2"]  # AR's candidate set on a fat tree: every min-hop uplink


def test_a_path_the_topology_cannot_place_is_no_route() -> None:
    topo = from_ibnetdiscover(FABRIC_DOWN.read_text())  # spine-2 - leaf-2 is gone
    stale = path_reading("gpu-a01", "gpu-b02", A01_GUID, B02_GUID, SPINE2_HOPS, "sweep")
    unknown = path_reading("gpu-a01", "gpu-b02", A01_GUID, B02_GUID, ["0x00000000deadbeef", B02_GUID], "sweep")
    assert routes_from_readings(topo, [stale]) == {}
    assert routes_from_readings(topo, [unknown]) == {}


def test_the_trace_command_must_name_both_lids() -> None:
    registry = {"ibfabric": "collectors.ibfabric:IbFabricCollector"}
    with pytest.raises(CollectorConfigError, match=r"collectors\.ibfabric\.ibtracert_command"):
        build(
            "ibfabric",
            {"ibtracert_command": ["ibtracert", "{src_lid}"]},
            node="m",
            sysfs_root=Path("/sys"),
            registry=registry,
        )


def test_turning_adaptive_routing_on_replaces_the_stored_static_path(tmp_path: Path) -> None:
    from fabricd.server import db
    from fabricd.server.routed_topology import trace_of
    from fabricd.server.store.storage import Storage

    engine = db.make_engine(f"sqlite:///{tmp_path / 'central.db'}")
    db.prepare(engine)
    store = Storage.open(engine)
    static = path_reading("gpu-a01", "gpu-b02", A01_GUID, B02_GUID, SPINE2_HOPS, "sweep")
    adaptive = path_reading("gpu-a01", "gpu-b02", A01_GUID, B02_GUID, (), "adaptive")
    topo = from_ibnetdiscover(FABRIC.read_text())

    def stored_routes() -> dict[tuple[str, str], list[str]]:
        traces = [trace_of(p) for p in store.paths.all()]
        return {
            (t.src, t.dst): t.elements for t in traced_routes(topo, traces, address_owners(to_doc(topo), [], traces))
        }

    store.paths.record([parse_path("sm-host", Sample(100.0, static))])
    assert stored_routes() == {("gpu-a01", "gpu-b02"): VIA_SPINE2}
    store.paths.record([parse_path("sm-host", Sample(160.0, adaptive))])
    assert [(p.node, p.peer, p.hops, p.version) for p in store.paths.all()] == [("gpu-a01", "gpu-b02", (), 2)]
    assert stored_routes() == {}
    engine.dispose()
