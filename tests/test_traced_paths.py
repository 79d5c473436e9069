"""Traced probe paths reach the central and localization (issue 16 §4): the pingmesh agent traces
each probe's 5-tuple, the central stores the raw hops per pair (versioned), maps them to topology
elements and hands detection the route, which replaces the pair's ECMP alternatives."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collectors.pingmesh import PingmeshCollector, PingmeshFactories, path_reading
from fabricd.collector import build
from fabricd.model import Kind, Reading, Sample, Status
from fabricd.pathtrace import Hop
from fabricd.server.app import create_app
from fabricd.server.detection import EngineDetector
from fabricd.server.pathreports import PathReport, split_paths
from fabricd.server.store.paths import Paths
from fabricd.server.store.sql import Database
from fabricd.settings import ServerSettings
from fabricd.topology import to_doc
from fabricd.topology.traced import Trace, TracedRoute, address_owners, merge_routes, route_of, traced_routes
from fabricd.tracing import BURST, TracedPath, TraceParams, TracePolicy
from tests.helpers import need_binary, need_root
from tests.support.lab import in_netns
from tests.support.routed_lab import SPINES, RoutedLab, routed_lab
from tests.support.server import encoded, make_batch, running

REGISTRY = {"pingmesh": "collectors.pingmesh:PingmeshCollector"}
T0 = 1_800_000_000.0
LAB = RoutedLab("x")
TOPO = LAB.topology()
# What the lab's interfaces say (RoutedLab.owners() on a built lab), without building one.
OWNERS = {
    "10.0.1.2": "gpu-a1",
    "10.0.2.2": "gpu-b1",
    "10.0.1.1": "rack1-leaf",
    "10.11.0.1": "rack1-leaf",
    "10.12.0.1": "rack1-leaf",
    "10.0.2.1": "rack2-leaf",
    "10.21.0.1": "rack2-leaf",
    "10.22.0.1": "rack2-leaf",
    "10.11.0.2": "spine-a",
    "10.21.0.2": "spine-a",
    "10.12.0.2": "spine-b",
    "10.22.0.2": "spine-b",
}
VIA_A = ("10.0.1.1", "10.11.0.2", "10.21.0.1", "10.0.2.2")
VIA_B = ("10.0.1.1", "10.12.0.2", "10.22.0.1", "10.0.2.2")
ROUTE_A = ["gpu-a1/eth0~rack1-leaf", "rack1-leaf~spine-a", "rack2-leaf~spine-a", "gpu-b1/eth0~rack2-leaf"]


def _doc_with_addresses() -> dict[str, Any]:
    doc = to_doc(TOPO)
    for e in doc["elements"]:
        owner = e.get("node") or e["id"]
        e["addresses"] = sorted(a for a, o in OWNERS.items() if o == owner)
    return doc


def _path_sample(ts: float, hops: tuple[str | None, ...], peer: str = "gpu-b1") -> Sample:
    """A trace as the agent reports it (the last hop the destination, reached)."""
    answered = tuple(Hop(i + 1, h, i == len(hops) - 1) for i, h in enumerate(hops))
    traced = TracedPath(peer, "10.0.1.2", 40001, "10.0.2.2", 19471, answered, "start")
    return Sample(ts, path_reading(traced), None, Status.OK)


# --- pure parts --------------------------------------------------------------------------------


def test_a_trace_is_taken_out_of_the_batch_with_its_raw_hops() -> None:
    other = Sample(T0, Reading("pingmesh", "gpu-b1", "", "probes_sent", 5.0, "probes", Kind.COUNTER), 1.0)
    batch = make_batch("gpu-a1", "b1", [other, _path_sample(T0, (VIA_A[0], None, *VIA_A[2:]))], T0)
    reports, rest = split_paths(batch)
    assert reports == [
        PathReport("gpu-a1", "gpu-b1", T0, "10.0.1.2", 40001, "10.0.2.2", 19471, (VIA_A[0], None, *VIA_A[2:]), True)
    ]
    assert rest.samples == [other]


def test_hop_addresses_map_to_elements_from_the_document_lldp_and_the_traces() -> None:
    lldp = Reading(
        "lldp",
        "swp2",
        "",
        "neighbor",
        1.0,
        "",
        Kind.INFO,
        (("chassis", "spine-b"), ("mgmt_ip", "10.12.0.2,10.22.0.2")),
        "neighbor_info",
    )
    doc = to_doc(TOPO)
    doc["elements"][0]["addresses"] = ["10.11.0.2"]  # spine-a, as an operator lists it
    trace = Trace("gpu-a1", "gpu-b1", "10.0.1.2", "10.0.2.2", VIA_A, T0)
    owners = address_owners(doc, [("rack1-leaf", Sample(T0, lldp))], [trace])
    assert doc["elements"][0]["id"] == "spine-a"
    assert owners == {
        "10.11.0.2": "spine-a",
        "10.12.0.2": "spine-b",
        "10.22.0.2": "spine-b",
        "10.0.1.2": "gpu-a1",
        "10.0.2.2": "gpu-b1",
    }
    # The leaves answer from addresses no source names: no route (the pair keeps its alternatives).
    assert route_of(TOPO, trace, owners) is None
    assert route_of(TOPO, trace, OWNERS) == ROUTE_A


def test_a_trace_silent_at_the_end_still_routes_and_one_silent_in_the_middle_does_not() -> None:
    silent_end = Trace("gpu-a1", "gpu-b1", "", "", (*VIA_A[:3], None, None), T0)
    assert route_of(TOPO, silent_end, OWNERS) == ROUTE_A  # rack2-leaf's only host link to gpu-b1
    assert route_of(TOPO, Trace("gpu-a1", "gpu-b1", "", "", (VIA_A[0], None, *VIA_A[2:]), T0), OWNERS) is None


def test_the_newer_of_an_uploaded_and_a_traced_route_wins() -> None:
    uploaded = {
        "routes": [
            {"src": "gpu-a1", "dst": "gpu-b1", "elements": ["x"]},
            {"src": "gpu-b1", "dst": "gpu-a1", "elements": ["y"]},
        ]
    }
    traced = [TracedRoute("gpu-a1", "gpu-b1", ROUTE_A, T0 + 1, 2), TracedRoute("gpu-b1", "gpu-a1", ["z"], T0 - 1, 1)]
    assert merge_routes(uploaded, T0, traced) == [
        {"src": "gpu-a1", "dst": "gpu-b1", "elements": ROUTE_A, "source": "trace", "traced_ts": T0 + 1, "version": 2},
        {"src": "gpu-b1", "dst": "gpu-a1", "elements": ["y"], "source": "upload"},
    ]


def test_the_policy_traces_every_pair_at_start_then_bad_pairs_then_refreshes_within_its_budget() -> None:
    params = TraceParams(refresh_seconds=600.0, pair_interval_seconds=60.0, rate_per_second=0.5)
    peers = [f"p{i}" for i in range(BURST + 2)]
    policy = TracePolicy(params, peers, 0.0)
    assert [policy.next_due(0.0) for _ in range(BURST + 1)] == [*((p, "start") for p in peers[:BURST]), None]
    assert [policy.next_due(2.0), policy.next_due(2.0), policy.next_due(4.0)] == [
        (peers[BURST], "start"),
        None,  # one token per 2 s
        (peers[BURST + 1], "start"),
    ]
    policy.mark_bad("p0", 10.0)  # traced at 0: not again before 60
    assert policy.next_due(59.0) is None
    assert policy.next_due(60.0) == ("p0", "bad")
    assert policy.next_due(601.0) == ("p1", "refresh")  # the oldest trace first


def test_a_pair_path_gets_a_new_version_only_when_its_hops_change(tmp_path: Path) -> None:
    from fabricd.server import db

    engine = db.make_engine(f"sqlite:///{tmp_path / 'f.db'}")
    db.prepare(engine)
    paths = Paths(Database.of(engine))

    def report(ts: float, hops: tuple[str, ...]) -> PathReport:
        return PathReport("gpu-a1", "gpu-b1", ts, "10.0.1.2", 40001, "10.0.2.2", 19471, hops, True)

    paths.record([report(T0, VIA_A)])
    paths.record([report(T0 + 120, VIA_A)])
    first = paths.all()
    paths.record([report(T0 + 200, VIA_B)])
    paths.record([report(T0 + 100, VIA_A)])  # older than the row (a spooled batch): nothing changes
    (row,) = paths.all()
    assert [(p.version, p.changed_ts, p.traced_ts, p.hops) for p in first] == [(1, T0, T0 + 120, VIA_A)]
    assert (row.version, row.changed_ts, row.traced_ts, row.hops) == (2, T0 + 200, T0 + 200, VIA_B)


def test_a_responders_reply_trace_is_its_pairs_reply_route_known_by_the_probers_address() -> None:
    # gpu-b1 answered gpu-a1's probes (it knows the prober by address only) and traced its replies
    # back over spine-b: the pair (gpu-a1, gpu-b1) gets that reply, from gpu-b1 back to gpu-a1.
    reply_hops = ("10.0.2.1", "10.22.0.2", "10.12.0.1", "10.0.1.2")
    reply = Trace("gpu-b1", "10.0.1.2", "10.0.2.2", "10.0.1.2", reply_hops, T0 + 5, 1, "reply")
    request = Trace("gpu-a1", "gpu-b1", "10.0.1.2", "10.0.2.2", VIA_A, T0)
    routes = traced_routes(TOPO, [request, reply], OWNERS)
    back = ["gpu-b1/eth0~rack2-leaf", "rack2-leaf~spine-b", "rack1-leaf~spine-b", "gpu-a1/eth0~rack1-leaf"]
    assert routes == [
        TracedRoute("gpu-a1", "gpu-b1", ROUTE_A, T0, 1),
        TracedRoute("gpu-a1", "gpu-b1", back, T0 + 5, 1, reply=True),
    ]
    (merged,) = merge_routes({}, 0.0, routes)
    assert (merged["elements"], merged["reply"], merged["source"]) == (ROUTE_A, back, "trace")
    # an upload newer than the reply trace keeps its own word (here: no reply)
    uploaded = {"routes": [{"src": "gpu-a1", "dst": "gpu-b1", "elements": ROUTE_A}]}
    assert "reply" not in merge_routes(uploaded, T0 + 10, routes)[0]
    assert merge_routes(uploaded, T0 + 1, routes)[0]["reply"] == back


# --- agents in a routed leaf-spine, a real central ----------------------------------------------


@pytest.fixture
def lab() -> Iterator[RoutedLab]:
    need_root()
    need_binary("ip")
    with routed_lab(f"fdtp{os.getpid() % 1000}") as built:
        yield built


def _factory(lab: RoutedLab, host: str) -> PingmeshFactories:
    return PingmeshFactories(
        socket=lambda family: in_netns(lab.ns(host), lambda: socket.socket(family, socket.SOCK_DGRAM))
    )


def _pingmesh(lab: RoutedLab, node: str, options: dict[str, Any]) -> PingmeshCollector:
    c = build(
        "pingmesh", options, node=node, sysfs_root=Path("/sys"), registry=REGISTRY, factories=[_factory(lab, node)]
    )
    assert isinstance(c, PingmeshCollector)
    return c


async def _probe_and_trace(lab: RoutedLab) -> tuple[list[Reading], dict[str, int]]:
    """gpu-a1 probes gpu-b1 (which only answers) and traces the pair; the packets each spine got
    from rack1-leaf (only gpu-a1's probes and trace cross there)."""
    b1 = _pingmesh(lab, "gpu-b1", {"listen_address": lab.address("gpu-b1")})
    peers = [{"name": "gpu-b1", "address": lab.address("gpu-b1"), "rate_per_second": 20}]
    a1 = _pingmesh(lab, "gpu-a1", {"peers": peers, "respond": False})
    await b1.start()
    before = {s: lab.rx_packets(s, "swp1") for s in SPINES}
    try:
        await a1.collect()
        readings: list[Reading] = []
        for _ in range(40):  # the start trace takes a few milliseconds; allow a loaded machine
            await asyncio.sleep(0.25)
            readings = list(await a1.collect())
            if any(r.name == "path_info" for r in readings):
                break
    finally:
        await a1.close()
        await b1.close()
    after = {s: lab.rx_packets(s, "swp1") for s in SPINES}
    return readings, {s: after[s] - before[s] for s in SPINES}


@pytest.mark.root
@pytest.mark.slow
async def test_an_agents_traced_route_reaches_the_central_and_replaces_the_ecmp_alternatives(
    lab: RoutedLab, tmp_path: Path
) -> None:
    readings, crossed = await _probe_and_trace(lab)
    (spine,) = [s for s, n in crossed.items() if n > 0]  # the probes' packets took one spine, none the other
    lost = sum(r.value for r in readings if r.name == "probes_lost")
    assert lost == 0  # the trace socket handed the probes' replies back to the prober
    now = time.time()
    samples = [Sample(now, r, None, Status.OK) for r in readings]
    settings = ServerSettings(db=f"sqlite:///{tmp_path / 'f.db'}", data_dir=tmp_path, auth=False)
    app = create_app(settings)
    async with running(app) as client:
        assert (await client.put("/api/v1/topology", json=_doc_with_addresses())).status_code == 200
        detector = EngineDetector(settings, app.state.services.routed, topology_check_seconds=0.0)
        detector.deliver([], now, frozenset())
        ecmp = detector.engine.localizer.pair_paths("gpu-a1", "gpu-b1")
        body, headers = encoded(make_batch("gpu-a1", "b1", samples, now))
        assert (await client.post("/api/v1/ingest", content=body, headers=headers)).status_code == 200
        (path,) = (await client.get("/api/v1/paths")).json()
        routes = (await client.get("/api/v1/topology")).json()["routes"]
        detector.deliver([], now + 1, frozenset())
        traced = detector.engine.localizer.pair_paths("gpu-a1", "gpu-b1")
    route = ["gpu-a1/eth0~rack1-leaf", f"rack1-leaf~{spine}", f"rack2-leaf~{spine}", "gpu-b1/eth0~rack2-leaf"]
    assert [h["element"] for h in path["hops"]] == ["rack1-leaf", spine, "rack2-leaf", "gpu-b1"]
    assert (path["route"], path["reached"], path["version"]) == (route, True, 1)
    assert [(r["src"], r["dst"], r["elements"], r["source"]) for r in routes] == [("gpu-a1", "gpu-b1", route, "trace")]
    assert sorted(len({e for e in alt if "~spine" in e}) for alt in ecmp) == [2, 2]  # two spines, two links each
    assert [sorted(e for e in alt if "spine" in e) for alt in traced] == [
        sorted([spine, f"rack1-leaf~{spine}", f"rack2-leaf~{spine}"])
    ]


async def _responder() -> PingmeshCollector:
    """Node b's pingmesh, answering on a free loopback port."""
    server = build(
        "pingmesh",
        {"listen_address": "127.0.0.1", "listen_port": 0},
        node="b",
        sysfs_root=Path("/sys"),
        registry=REGISTRY,
    )
    assert isinstance(server, PingmeshCollector)
    await server.start()
    return server


async def _loopback_readings(trace_paths: bool) -> list[Reading]:
    server = await _responder()
    peers = [{"name": "b", "address": "127.0.0.1", "port": server.listen_port, "rate_per_second": 50}]
    options = {"peers": peers, "respond": False, "trace_paths": trace_paths}
    client = build("pingmesh", options, node="a", sysfs_root=Path("/sys"), registry=REGISTRY)
    assert isinstance(client, PingmeshCollector)
    try:
        await client.collect()
        out: list[Reading] = []
        for _ in range(20):
            await asyncio.sleep(0.1)
            out += await client.collect()
            if any(r.name == "path_info" for r in out):
                break
        return out
    finally:
        await client.close()
        await server.close()


async def test_a_pair_is_traced_at_start_and_not_at_all_with_trace_paths_off() -> None:
    traced = [r for r in await _loopback_readings(True) if r.name == "path_info"]
    assert [
        (r.device, dict(r.labels)["hops"], dict(r.labels)["reached"], dict(r.labels)["reason"]) for r in traced
    ] == [("b", "127.0.0.1", "true", "start")]
    off = await _loopback_readings(False)
    assert [r for r in off if r.name == "path_info"] == [] and sum(
        r.value for r in off if r.name == "probes_received"
    ) > 0


async def test_an_uploaded_route_holds_until_a_newer_trace_and_a_newer_upload_wins_again(tmp_path: Path) -> None:
    uploaded = ROUTE_A
    doc = {**_doc_with_addresses(), "routes": [{"src": "gpu-a1", "dst": "gpu-b1", "elements": uploaded}]}
    clock = [T0]
    app = create_app(
        ServerSettings(db=f"sqlite:///{tmp_path / 'f.db'}", data_dir=tmp_path, auth=False), clock=lambda: clock[0]
    )

    async def routes() -> list[tuple[list[str], str, int | None]]:
        got = (await client.get("/api/v1/topology")).json()["routes"]
        return [(r["elements"], r["source"], r["version"]) for r in got]

    async with running(app) as client:
        assert (await client.put("/api/v1/topology", json=doc)).status_code == 200
        first = await routes()
        for i, (ts, hops) in enumerate(((T0 - 5, VIA_A), (T0 + 5, VIA_A), (T0 + 6, VIA_B))):
            body, headers = encoded(make_batch("gpu-a1", f"b{i}", [_path_sample(ts, hops)], ts, seq=i + 1))
            assert (await client.post("/api/v1/ingest", content=body, headers=headers)).status_code == 200
            if i == 0:
                older = await routes()  # traced before the upload: the upload stands
        traced = await routes()
        clock[0] = T0 + 10
        assert (await client.put("/api/v1/topology", json=doc)).status_code == 200
        again = await routes()
    route_b = ["gpu-a1/eth0~rack1-leaf", "rack1-leaf~spine-b", "rack2-leaf~spine-b", "gpu-b1/eth0~rack2-leaf"]
    assert first == older == again == [(uploaded, "upload", None)]
    assert traced == [(route_b, "trace", 2)]  # VIA_A, then VIA_B: the pair's second path


async def test_a_responder_traces_the_path_of_its_replies_to_each_prober_it_hears() -> None:
    # Loopback: the reply trace is one hop, the prober itself, which echoes it (TRACE_SESSION).
    server = await _responder()
    peers = [{"name": "b", "address": "127.0.0.1", "port": server.listen_port, "rate_per_second": 50}]
    client = build("pingmesh", {"peers": peers, "respond": False}, node="a", sysfs_root=Path("/sys"), registry=REGISTRY)
    assert isinstance(client, PingmeshCollector)
    try:
        await client.collect()
        got: list[Reading] = []
        for _ in range(40):
            await asyncio.sleep(0.1)
            got += await server.collect()
            sent = [r for r in await client.collect() if r.name == "probes_lost"]
            if any(r.name == "path_info" for r in got):
                break
        assert client.prober is not None
        src_port = client.prober.transport.get_extra_info("sockname")[1]
    finally:
        await client.close()
        await server.close()
    (reply,) = [dict(r.labels) for r in got if r.name == "path_info"]
    assert {k: reply[k] for k in ("direction", "src", "src_port", "dst", "dst_port", "hops", "reached")} == {
        "direction": "reply",
        "src": "127.0.0.1",
        "src_port": str(peers[0]["port"]),
        "dst": "127.0.0.1",
        "dst_port": str(src_port),
        "hops": "127.0.0.1",
        "reached": "true",
    }
    assert sent and sum(r.value for r in sent) == 0  # the responder answered every probe meanwhile


def test_refreshes_of_pairs_traced_together_come_due_spread_over_a_fifth_of_the_period() -> None:
    # Agents started together trace every pair at once; without a spread they would refresh them
    # all in the same second, every 10 minutes, fleet-wide (the switches' ICMP is rate limited).
    params = TraceParams(refresh_seconds=600.0, rate_per_second=1000.0)
    peers = [f"p{i}" for i in range(BURST)]
    policy = TracePolicy(params, peers, 0.0, random.Random(7))
    assert [policy.next_due(0.0) for _ in peers] == [(p, "start") for p in peers]
    fired: dict[str, float] = {}
    for second in range(500, 701):
        while (due := policy.next_due(float(second))) is not None:
            assert due[1] == "refresh"
            fired.setdefault(due[0], float(second))
    assert set(fired) == set(peers)
    assert min(fired.values()) >= 540.0 and max(fired.values()) <= 661.0
    assert max(fired.values()) - min(fired.values()) >= 30.0  # 5 draws over 120 s: not all together
