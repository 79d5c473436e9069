"""Capture: decoding PFC/PAUSE frames and RoCEv2 CNPs (pure), and counting them per priority and sender.

The frames are built with scapy's own MAC-control and RoCE layers (the oracle for the byte layout);
the real AF_PACKET path over a veth is in tests/test_lab.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collectors.capture import CaptureBatch, CaptureCollector, CaptureFactories, Cnp, FlowControl, classify
from fabricd.collector import build
from fabricd.model import Kind, Reading

REGISTRY = {"capture": "collectors.capture:CaptureCollector"}
A, B, C = "02:00:00:00:00:0a", "02:00:00:00:00:0b", "02:00:00:00:00:0c"


def pfc(src: str, **fields: Any) -> bytes:
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl
    from scapy.layers.l2 import Ether

    return bytes(Ether(src=src, dst="01:80:c2:00:00:01", type=0x8808) / MACControlClassBasedFlowControl(**fields))


def pause(src: str, quanta: int) -> bytes:
    from scapy.contrib.mac_control import MACControlPause
    from scapy.layers.l2 import Ether

    return bytes(Ether(src=src, dst="01:80:c2:00:00:01", type=0x8808) / MACControlPause(pause_time=quanta))


def rocev2(src_ip: str, opcode: int, tos: int = 0) -> bytes:
    from scapy.contrib.roce import BTH, cnp
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    bth = cnp(dqpn=0x12) if opcode == 0x81 else BTH(opcode=opcode, dqpn=0x12)
    return bytes(Ether() / IP(src=src_ip, dst="10.0.0.9", tos=tos) / UDP(sport=49152, dport=4791) / bth)


def plain_udp() -> bytes:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    return bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(dport=53) / b"x")


class ListSource:
    """A frame source fed with prepared frames (the capture factory's seam)."""

    def __init__(self, interface: str) -> None:
        self.interface = interface
        self.pending: list[bytes] = []
        self.dropped = 0

    def read(self, max_frames: int) -> CaptureBatch:
        frames, self.pending = self.pending[:max_frames], self.pending[max_frames:]
        dropped, self.dropped = self.dropped, 0
        return CaptureBatch(frames, dropped)


def _collector(source: ListSource, **options: object) -> CaptureCollector:
    collector = build(
        "capture",
        {"interface": "eth9", **options},
        node="n1",
        sysfs_root=Path("/sys"),
        registry=REGISTRY,
        factories=[CaptureFactories(source=lambda _iface: source)],
    )
    assert isinstance(collector, CaptureCollector)
    return collector


def _counts(readings: Sequence[Reading]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(r.counter, r.labels): r.value for r in readings}


def test_classify_pfc_pause_and_cnp() -> None:
    assert classify(pfc(A, c3_enabled=1, c3_pause_time=0xFFFF, c5_enabled=1, c5_pause_time=7)) == FlowControl(
        A, {3: 0xFFFF, 5: 7}
    )
    assert classify(pause(B, 100)) == FlowControl(B, {None: 100})
    assert classify(rocev2("10.0.0.7", 0x81, tos=26 << 2)) == Cnp("10.0.0.7", 26)
    assert classify(rocev2("10.0.0.7", 0x64)) is None  # RoCE data (UD SEND), not a CNP
    assert classify(plain_udp()) is None


async def test_counts_per_priority_and_sender() -> None:
    source = ListSource("eth9")
    collector = _collector(source)
    source.pending = [pfc(A, c3_enabled=1, c3_pause_time=0xFFFF)] * 4 + [
        pfc(A, c3_enabled=1, c3_pause_time=0),  # XON on priority 3
        pfc(B, c3_enabled=1, c3_pause_time=10, c5_enabled=1, c5_pause_time=20),
        pause(C, 5),
        rocev2("10.0.0.7", 0x81, tos=26 << 2),
        rocev2("10.0.0.7", 0x81, tos=26 << 2),
        plain_udp(),
    ]
    source.dropped = 3
    got = _counts(await collector.collect())
    assert got[("pfc_pause_frames", (("priority", "3"), ("sender", A)))] == 4
    assert got[("pfc_resume_frames", (("priority", "3"), ("sender", A)))] == 1
    assert got[("pfc_pause_quanta", (("priority", "3"), ("sender", A)))] == 4 * 0xFFFF
    assert got[("pfc_pause_frames", (("priority", "5"), ("sender", B)))] == 1
    assert got[("pause_frames", (("sender", C),))] == 1
    assert got[("cnp_frames", (("dscp", "26"), ("sender", "10.0.0.7")))] == 2
    assert got[("capture_dropped", ())] == 3


async def test_counters_are_cumulative_across_collects() -> None:
    source = ListSource("eth9")
    collector = _collector(source)
    key = ("pfc_pause_frames", (("priority", "0"), ("sender", A)))
    source.pending = [pfc(A, c0_enabled=1, c0_pause_time=1)] * 2
    first = await collector.collect()
    source.pending = [pfc(A, c0_enabled=1, c0_pause_time=1)]
    second = await collector.collect()
    assert (_counts(first)[key], _counts(second)[key]) == (2, 3)
    assert all(r.kind is Kind.COUNTER and r.source == "capture" and r.device == "eth9" for r in second)


async def test_sender_cardinality_is_bounded() -> None:
    source = ListSource("eth9")
    collector = _collector(source, max_senders=2)
    source.pending = [pfc(mac, c1_enabled=1, c1_pause_time=1) for mac in (A, B, C, C)]
    senders = {dict(r.labels)["sender"] for r in await collector.collect() if r.counter == "pfc_pause_frames"}
    assert senders == {A, B, "other"}
