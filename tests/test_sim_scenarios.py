"""Scenario files, fault effects, the NCCL-tests stand-in and the real-time simulator."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fabricd.collector import build
from fabricd.parsers.nccl import parse_nccl_output
from fabricd.probe import REQUEST, Probe, encode
from fabricd.sim import live
from fabricd.sim.cluster import create
from fabricd.sim.scenario import FAULT_KINDS, ScenarioError, load, parse, shipped
from tests.helpers import skip_or_fail


def _base(**over: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "name": "t",
        "seed": 3,
        "duration": "5m",
        "interval": "10s",
        "topology": {"nodes": 8, "hcas_per_node": 2, "nodes_per_leaf": 4, "spines": 2, "link_layer": "roce"},
    }
    doc.update(over)
    return doc


def test_shipped_scenarios_cover_every_fault_kind_on_both_link_layers() -> None:
    scenarios = [load(name) for name in shipped()]
    seen = {(f.kind, s.topology.link_layer) for s in scenarios for f in s.faults}
    for kind in FAULT_KINDS:
        layers = {"roce"} if kind == "pfc_storm" else {"roce", "infiniband"}  # InfiniBand has no PFC
        assert {(kind, layer) for layer in layers} <= seen, kind
    assert any(not s.faults for s in scenarios)  # clean
    assert any(len({f.kind for f in s.faults}) > 2 for s in scenarios)  # mixed, overlapping
    large = load("large")
    assert large.topology.nodes == 256 and large.duration == 3600


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        (_base(duration="5 minutes"), "duration"),
        (_base(faults=[{"kind": "congestion", "at": "leaf-09~spine-01", "start": "1m", "end": "2m"}]), "faults[0].at"),
        (_base(faults=[{"kind": "straggler", "at": "node-001/mlx5_0", "start": "1m", "end": "2m"}]), "faults[0].at"),
        (_base(faults=[{"kind": "congestion", "at": "leaf-01~spine-01", "start": "3m", "end": "2m"}]), "faults.0"),
        (_base(faults=[{"kind": "gremlins", "at": "leaf-01~spine-01", "start": "1m", "end": "2m"}]), "faults.0.kind"),
        (_base(workload={"load": 1.5}), "workload.load"),
    ],
)
def test_invalid_scenarios_are_rejected_naming_the_key(doc: dict[str, object], key: str) -> None:
    with pytest.raises(ScenarioError, match=key.replace("[", r"\[").replace("]", r"\]")):
        parse(doc, "bad.yaml")


def test_pfc_storm_on_infiniband_is_rejected() -> None:
    doc = _base(faults=[{"kind": "pfc_storm", "at": "node-001/mlx5_0", "start": "1m", "end": "2m"}])
    doc["topology"] = {**doc["topology"], "link_layer": "infiniband"}  # type: ignore[dict-item]
    with pytest.raises(ScenarioError, match="PFC"):
        parse(doc)


def test_truth_goes_to_its_own_file_with_symptom_times(tmp_path: Path) -> None:
    sc = parse(_base(faults=[{"kind": "congestion", "at": "leaf-01~spine-02", "start": "65s", "end": "3m"}]))
    cluster = create(sc, tmp_path, 1000.0)
    truth = json.loads((tmp_path / "truth.json").read_text())
    fault = truth["faults"][0]
    assert fault["element"] == "leaf-01~spine-02" and fault["start_ts"] == 1065.0
    assert fault["symptom_ts"] == 1070.0  # the first scrape after the fault began
    assert "node-001" in fault["scope"]  # node-001's traffic crosses leaf-01's uplinks
    assert not any("truth" in p.name for p in cluster.node_dir("node-001").rglob("*"))


def test_nccl_standin_prints_real_format_and_a_straggler_slows_every_run(tmp_path: Path) -> None:
    sc = parse(_base(faults=[{"kind": "straggler", "at": "node-003", "start": "1m", "end": "4m", "severity": 1.0}]))
    cluster = create(sc, tmp_path, 0.0)
    cluster.advance_to(120.0)
    cluster.write_nccl(120.0)
    out = subprocess.run(cluster.standin_command("node-003"), capture_output=True, text=True, check=True).stdout
    run = parse_nccl_output(out, op="all_reduce")
    assert run.success and len(run.rows) == 2 * sc.workload.nccl_sizes
    assert "node-003" in {r.host for r in run.ranks}
    slow = run.avg_busbw_bytes_per_second
    healthy = parse_nccl_output(cluster.nccl_output("node-006", 120.0), op="all_reduce")
    assert "node-003" not in {r.host for r in healthy.ranks}
    assert slow is not None and healthy.avg_busbw_bytes_per_second is not None
    assert slow < 0.6 * healthy.avg_busbw_bytes_per_second


def test_congestion_marks_ecn_only_on_flows_crossing_the_link(tmp_path: Path) -> None:
    sc = parse(
        _base(faults=[{"kind": "congestion", "at": "leaf-01~spine-01", "start": "0s", "end": "5m", "severity": 1.0}])
    )
    cluster = create(sc, tmp_path, 0.0)
    before = {p: s.hw.totals["np_ecn_marked_roce_packets"] for p, s in cluster.sim.ports.items()}
    cluster.advance_to(60.0)
    marked = {p: s.hw.totals["np_ecn_marked_roce_packets"] - before[p] for p, s in cluster.sim.ports.items()}
    crossing = {f.dst for f in cluster.sim.fabric.flows if "leaf-01~spine-01" in f.links}
    assert crossing and min(marked[p] for p in crossing) > 100 * max(
        (m for p, m in marked.items() if p not in crossing), default=1.0
    )


async def test_live_cluster_moves_counters_and_answers_probes(tmp_path: Path) -> None:
    from collectors import REGISTRY

    handle = await asyncio.to_thread(live.start, "clean", tmp_path, 50.0, 8)
    try:
        config = handle.agent_config("node-001")["collectors"]
        path = handle.sysfs_root("node-001") / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data"
        first = int(path.read_text())
        mesh = build("pingmesh", config["pingmesh"], node="node-001", sysfs_root=tmp_path, registry=REGISTRY)
        await mesh.collect()
        deadline = time.monotonic() + 10
        received = 0.0
        while time.monotonic() < deadline and received == 0:
            await asyncio.sleep(0.5)
            readings = await mesh.collect()
            received = sum(r.value for r in readings if r.counter == "probes_received")
        close = getattr(mesh, "close", None)
        if close is not None:
            await close()
        assert received > 0  # real UDP probes answered by the simulator's path responders
        assert int(path.read_text()) > first  # scenario time moved at 50x
    finally:
        await asyncio.to_thread(handle.stop)
    assert handle.error is None


def test_fabricd_sim_command_writes_agent_configs(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabricd", "sim", "clean", "--out", str(tmp_path), "--speed", "100", "--nodes", "8"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (tmp_path / "agents" / "node-008.yaml").exists():
            time.sleep(0.2)
        assert (tmp_path / "agents" / "node-008.yaml").exists()
        assert (tmp_path / "nodes/node-008/sys/class/infiniband/mlx5_1/ports/1/hw_counters").is_dir()
    finally:
        proc.send_signal(2)  # Ctrl-C stops it cleanly
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


async def test_the_live_responders_delay_a_reply_by_the_path_model_not_by_the_loops_millisecond(tmp_path: Path) -> None:
    """A congested path's replies wait the model's queue (about 0.2 ms here), not asyncio's epoll
    millisecond (the simulator's epoll rounds its waits down and polls for the rest), in a process
    holding descriptors numbered past 1024 as a long test run does (select() refused those)."""
    scenario = load(
        "demo", faults=[{"kind": "congestion", "at": "leaf-02~spine-01", "start": 0, "end": 3600, "severity": 0.5}]
    )
    held = _descriptors_past(1024)
    try:
        handle = await asyncio.to_thread(live.start, scenario, tmp_path)
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    try:
        probes = handle.cluster.sim.fabric.probes
        slow = next(p for p in probes if "leaf-02~spine-01" in p.links)
        fast = next(p for p in probes if len(p.links) == 4 and "leaf-02~spine-01" not in p.links)
        await asyncio.sleep(2 * scenario.sim_step)  # the model's first steps: the fault is on
        slow_rtt = await _min_rtt(handle.ports[(slow.src, slow.dst)])
        fast_rtt = await _min_rtt(handle.ports[(fast.src, fast.dst)])
    finally:
        handle.stop()
        for fd in held:
            os.close(fd)
    assert 0.05e-3 < slow_rtt - fast_rtt < 0.6e-3, (slow_rtt, fast_rtt)  # epoll made it 1 ms or more


def _descriptors_past(number: int) -> list[int]:
    """Open /dev/null until a descriptor numbered ``number`` or more is open (raising the soft limit
    within the hard one); the caller closes them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < number + 64:
        skip_or_fail(f"the open-files hard limit ({hard}) is under {number + 64}")
    if soft != resource.RLIM_INFINITY and soft < number + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (number + 64, hard))
    held = [os.open(os.devnull, os.O_RDONLY)]
    while held[-1] < number:
        held.append(os.open(os.devnull, os.O_RDONLY))
    return held


async def _min_rtt(port: int, count: int = 30) -> float:
    loop = asyncio.get_running_loop()
    replies: asyncio.Queue[float] = asyncio.Queue()

    class _Prober(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: Any) -> None:
            replies.put_nowait(time.perf_counter())

    transport, _ = await loop.create_datagram_endpoint(_Prober, remote_addr=("127.0.0.1", port))
    rtts = []
    try:
        for seq in range(count):
            sent = time.perf_counter()
            transport.sendto(encode(Probe(REQUEST, 1, seq, time.monotonic_ns())))
            rtts.append(await asyncio.wait_for(replies.get(), 2.0) - sent)
            await asyncio.sleep(0.03)
    finally:
        transport.close()
    return min(rtts)
