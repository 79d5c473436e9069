"""The netns lab: real congestion, loss, HOL blocking and PFC frames, measured by the real collectors.

Topology (tests/support/lab.py): hosts h0..h3 on one bridge. Every assertion compares pairs that cross a
bottleneck with pairs that do not, in the same run, so the margins hold on a busy 2-core machine.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest

from collectors.capture import AfPacketSource, CaptureCollector, CaptureFactories
from collectors.pingmesh import PingmeshCollector, PingmeshFactories
from fabricd.collector import build
from fabricd.model import Reading
from tests.helpers import built_lab, need_root
from tests.support.lab import Bottleneck, Direction, Lab, stale_namespaces

pytestmark = [pytest.mark.root, pytest.mark.slow]

PREFIX = "fdlab"
HOSTS = ["h0", "h1", "h2", "h3"]
REGISTRY = {
    "pingmesh": "collectors.pingmesh:PingmeshCollector",
    "capture": "collectors.capture:CaptureCollector",
}
RATE = 8_000_000  # bottleneck: 8 Mbit/s = 1 MB/s
BULK = 2_500_000  # bytes/s offered by the bulk flow: 2.5x the bottleneck


@pytest.fixture
def lab() -> Iterator[Lab]:
    yield from built_lab(HOSTS, PREFIX)


class Mesh:
    """One pingmesh agent per host, inside its namespace; every agent answers probes."""

    def __init__(self, lab: Lab, probes: dict[str, Sequence[str]], rate: float = 40, timeout: float = 1.0):
        self.agents: dict[str, PingmeshCollector] = {}
        for host in lab.hosts:
            peers = [{"name": p, "address": lab.address(p), "rate_per_second": rate} for p in probes.get(host, ())]
            options = {"peers": peers, "listen_address": lab.address(host), "timeout_seconds": timeout}
            agent = build(
                "pingmesh",
                options,
                node=host,
                sysfs_root=Path("/sys"),
                registry=REGISTRY,
                factories=[PingmeshFactories(socket=lab.socket_factory(host))],
            )
            assert isinstance(agent, PingmeshCollector)
            self.agents[host] = agent

    async def collect(self) -> dict[str, dict[str, dict[str, float]]]:
        """host -> peer -> counter -> value."""
        for agent in self.agents.values():
            await agent.start(probe=False)  # every responder is up before the first probe
        out: dict[str, dict[str, dict[str, float]]] = {}
        for host, agent in self.agents.items():
            readings: Sequence[Reading] = await agent.collect()
            for r in readings:
                out.setdefault(host, {}).setdefault(r.device, {})[r.counter] = r.value
        return out

    async def drain(self, seconds: float) -> dict[str, dict[str, dict[str, float]]]:
        for agent in self.agents.values():
            agent.stop_probing()
        await asyncio.sleep(seconds)
        return await self.collect()

    async def close(self) -> None:
        for agent in self.agents.values():
            await agent.close()


@pytest.fixture
async def meshes() -> AsyncIterator[list[Mesh]]:
    made: list[Mesh] = []
    yield made
    for mesh in made:
        await mesh.close()


async def _loaded_interval(lab: Lab, mesh: Mesh, src: str, dst: str, seconds: float = 1.5) -> dict:
    """RTTs over an interval while ``src`` blasts ``dst`` (after the queue has had time to fill)."""
    await mesh.collect()  # starts probing
    await asyncio.sleep(0.3)
    lab.blast(src, dst, rate_bytes_per_second=BULK, seconds=seconds + 1.5)
    await asyncio.sleep(0.7)
    await mesh.collect()  # discard the filling phase: the next interval is all under load
    await asyncio.sleep(seconds)
    return await mesh.collect()


async def test_congestion_raises_rtt_only_across_the_bottleneck(lab: Lab, meshes: list[Mesh]) -> None:
    lab.shape("h2", Direction.TO_HOST, Bottleneck(RATE, limit_bytes=150_000))
    mesh = Mesh(lab, {"h1": ["h2", "h3"]})
    meshes.append(mesh)
    got = await _loaded_interval(lab, mesh, "h0", "h2")
    stats = {q.kind: q for q in lab.qdisc_stats("h2", Direction.TO_HOST)}
    crossing, flat = got["h1"]["h2"]["rtt_p50"], got["h1"]["h3"]["rtt_p50"]
    print(f"p50 RTT h1->h2 (crossing) {crossing * 1e3:.2f} ms, h1->h3 {flat * 1e3:.2f} ms; tbf {stats['tbf']}")
    # 150 kB at 1 MB/s is ~150 ms of queue; the flat pair stays sub-millisecond on an idle box.
    assert crossing > 10 * flat and crossing - flat > 0.03
    assert stats["tbf"].backlog_bytes > 10_000 and stats["tbf"].overlimits > 0


async def test_small_fifo_under_load_drops_probes_on_crossing_pairs(lab: Lab, meshes: list[Mesh]) -> None:
    lab.shape("h2", Direction.TO_HOST, Bottleneck(RATE, fifo_packets=8))
    mesh = Mesh(lab, {"h1": ["h2", "h3"]}, rate=50, timeout=0.5)
    meshes.append(mesh)
    await _loaded_interval(lab, mesh, "h0", "h2", seconds=1.5)
    got = await mesh.drain(1.2)  # past the timeout and the settling after it (collectors/pingmesh.py)
    fifo = {q.kind: q for q in lab.qdisc_stats("h2", Direction.TO_HOST)}["pfifo"]
    lossy, clean = got["h1"]["h2"], got["h1"]["h3"]
    print(
        f"h1->h2 lost {lossy['probes_lost']:.0f}/{lossy['probes_sent']:.0f}, "
        f"h1->h3 lost {clean['probes_lost']:.0f}/{clean['probes_sent']:.0f}, pfifo drops {fifo.drops}"
    )
    assert lossy["probes_lost"] >= max(10, 0.1 * lossy["probes_sent"])  # ~30% measured
    assert clean["probes_lost"] == 0
    assert lossy["probes_received"] + lossy["probes_lost"] == lossy["probes_sent"]  # drained: exact
    assert fifo.drops > lossy["probes_lost"]  # the bulk flow lost far more than the probes


async def test_hol_blocking_victim_shares_the_bulk_flows_fifo(lab: Lab, meshes: list[Mesh]) -> None:
    # h0's uplink is one FIFO: its bulk flow to h2 delays its tiny probe flow to h3, although
    # nothing on the path to h3 is congested; h1's probes to the same h3 stay flat.
    lab.shape("h0", Direction.FROM_HOST, Bottleneck(RATE, limit_bytes=150_000))
    mesh = Mesh(lab, {"h0": ["h3"], "h1": ["h3"]})
    meshes.append(mesh)
    got = await _loaded_interval(lab, mesh, "h0", "h2")
    victim, control = got["h0"]["h3"]["rtt_p50"], got["h1"]["h3"]["rtt_p50"]
    print(f"p50 RTT h0->h3 (victim) {victim * 1e3:.2f} ms, h1->h3 (control) {control * 1e3:.2f} ms")
    assert victim > 10 * control and victim - control > 0.02


def _raw_socket(lab: Lab, host: str) -> socket.socket:
    return lab.open_socket(host, socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))


async def test_pfc_frames_and_cnps_over_a_veth_are_counted(lab: Lab) -> None:
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl
    from scapy.contrib.roce import cnp
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    port = lab.switch_port("h0")  # the switch side of h0's cable receives what h0 sends
    collector = build(
        "capture",
        {"interface": port},
        node="sw",
        sysfs_root=Path("/sys"),
        registry=REGISTRY,
        factories=[CaptureFactories(source=lambda iface: AfPacketSource(iface, _raw_socket(lab, "sw")))],
    )
    assert isinstance(collector, CaptureCollector)
    mac = lab.mac("h0")
    xoff = Ether(src=mac, dst="01:80:c2:00:00:01", type=0x8808) / MACControlClassBasedFlowControl(
        c3_enabled=1, c3_pause_time=0xFFFF
    )
    both = Ether(src=mac, dst="01:80:c2:00:00:01", type=0x8808) / MACControlClassBasedFlowControl(
        c3_enabled=1, c3_pause_time=100, c5_enabled=1, c5_pause_time=200
    )
    notify = (
        Ether(src=mac, dst=lab.mac("h1"))
        / IP(src=lab.address("h0"), dst=lab.address("h1"), tos=26 << 2)
        / UDP(sport=50000, dport=4791)
        / cnp(dqpn=5)
    )
    noise = Ether(src=mac, dst=lab.mac("h1")) / IP(src=lab.address("h0"), dst=lab.address("h1")) / UDP(dport=53)
    sender = _raw_socket(lab, "h0")
    sender.bind((lab.host_iface("h0"), 0))
    for frame in [xoff] * 5 + [both] * 2 + [notify] * 3 + [noise] * 20:
        sender.send(bytes(frame))
    sender.close()
    await asyncio.sleep(0.2)
    readings = await collector.collect()
    await collector.close()
    got = {(r.counter, r.labels): r.value for r in readings}
    assert got[("pfc_pause_frames", (("priority", "3"), ("sender", mac)))] == 7
    assert got[("pfc_pause_frames", (("priority", "5"), ("sender", mac)))] == 2
    assert got[("pfc_pause_quanta", (("priority", "3"), ("sender", mac)))] == 5 * 0xFFFF + 2 * 100
    assert got[("cnp_frames", (("dscp", "26"), ("sender", lab.address("h0"))))] == 3
    assert got[("capture_dropped", ())] == 0


def test_lab_tears_down_when_the_body_fails() -> None:
    need_root()
    subprocess.run(["ip", "netns", "add", f"{PREFIX}-stale"], check=True)  # left by a killed run
    with pytest.raises(RuntimeError, match="boom"), Lab(["a", "b"], prefix=PREFIX) as built:
        assert f"{PREFIX}-stale" not in stale_namespaces(PREFIX)  # cleaned at start
        assert stale_namespaces(PREFIX) == [f"{PREFIX}-a", f"{PREFIX}-b", f"{PREFIX}-sw"]
        built.blast("a", "b", rate_bytes_per_second=10_000, seconds=30)
        raise RuntimeError("boom")
    assert stale_namespaces(PREFIX) == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert "fl-a" not in links and "fl-b" not in links
