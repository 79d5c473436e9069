"""Capture collector: count PFC pause frames and RoCEv2 CNPs seen on an interface.

Frames come from an AF_PACKET socket (``CaptureFactories.source``; the lab opens one inside a namespace)
with a classic BPF filter so the kernel hands us only MAC-control frames and UDP/4791 datagrams.
Decoding is scapy, in a pure function (``classify``).

What is counted (cumulative COUNTERs, ``device`` = interface):

- ``pfc_pause_frames`` / ``pfc_resume_frames`` {priority, sender}: IEEE 802.1Qbb priority flow control
  frames (ethertype 0x8808, opcode 0x0101), per priority whose class-enable bit is set; a quanta of 0
  is XON (resume). ``pfc_pause_quanta`` sums the quanta (1 quantum = 512 bit times, so its duration
  depends on the link speed: 5.12 ns at 100 Gb/s).
- ``pause_frames`` {sender}: IEEE 802.3 Annex 31B link-level PAUSE (opcode 0x0001).
- ``cnp_frames`` {sender, dscp}: RoCEv2 congestion notification packets (UDP dst 4791, BTH opcode
  0x81, IBTA Annex A17); ``sender`` is the notification point's IP address.
- ``capture_dropped``: frames the kernel dropped because we did not read fast enough.

Caveat (docs/latency.md): a real NIC's MAC consumes PFC frames and a RoCE NIC consumes CNPs in
hardware; the host stack sees them on a mirror/SPAN port, a switch CPU tap or a software link (the lab).
"""

from __future__ import annotations

import ctypes
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from pydantic import Field

from fabricd.collector import CollectorContext, CollectorFactories, CollectorOptions
from fabricd.model import Kind, Reading, labels_of

SOURCE = "capture"
ETH_P_ALL = 0x0003
ETH_P_MAC_CONTROL = 0x8808
ROCEV2_PORT = 4791
CNP_OPCODE = 0x81  # BTH opcode of a RoCEv2 CNP (IBTA Annex A17.9.2)
SO_ATTACH_FILTER = 26
PACKET_STATISTICS = 6
SOL_PACKET = 263
PACKET_OUTGOING = 4
OTHER = "other"


class CaptureOptions(CollectorOptions):
    interface: str = Field(min_length=1, max_length=15)
    max_frames_per_collect: int = Field(default=100_000, gt=0)
    max_senders: int = Field(default=256, gt=0, le=10_000)


@dataclass(frozen=True, slots=True)
class CaptureBatch:
    frames: list[bytes]
    dropped: int = 0  # frames the kernel dropped since the last read


class FrameSource(Protocol):
    def read(self, max_frames: int) -> CaptureBatch: ...


@dataclass(frozen=True, slots=True)
class FlowControl:
    """A decoded PAUSE or PFC frame: ``quanta`` per enabled priority (None key = link-level PAUSE)."""

    sender: str
    quanta: dict[int | None, int]


@dataclass(frozen=True, slots=True)
class Cnp:
    sender: str
    dscp: int


def classify(frame: bytes) -> FlowControl | Cnp | None:
    """Decode one Ethernet frame; None for anything that is neither flow control nor a CNP."""
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl, MACControlPause
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    pkt = Ether(frame)
    if pfc := pkt.getlayer(MACControlClassBasedFlowControl):
        enabled: dict[int | None, int] = {
            p: int(getattr(pfc, f"c{p}_pause_time")) for p in range(8) if getattr(pfc, f"c{p}_enabled")
        }
        return FlowControl(pkt.src, enabled)
    if pause := pkt.getlayer(MACControlPause):
        return FlowControl(pkt.src, {None: int(pause.pause_time)})
    is_roce = pkt.haslayer(IP) and pkt.haslayer(UDP) and pkt[UDP].dport == ROCEV2_PORT and pkt.haslayer(BTH)
    if is_roce and pkt[BTH].opcode == CNP_OPCODE:
        return Cnp(pkt[IP].src, int(pkt[IP].tos) >> 2)
    return None


# --- the AF_PACKET source -----------------------------------------------------------------------


def _bpf_program() -> list[tuple[int, int, int, int]]:
    """cBPF for ``ether proto 0x8808 or (ip or ip6) and udp dst port 4791`` (as tcpdump -dd emits)."""
    ldh_abs, ldb_abs, jeq, jset, ldxb_msh, ldh_ind, ret = 0x28, 0x30, 0x15, 0x45, 0xB1, 0x48, 0x06
    return [
        (ldh_abs, 0, 0, 12),  # 0: ethertype
        (jeq, 13, 0, ETH_P_MAC_CONTROL),  # 1: -> 15 accept
        (jeq, 0, 7, 0x0800),  # 2: IPv4? else -> 10
        (ldb_abs, 0, 0, 23),  # 3: IP protocol
        (jeq, 0, 11, 17),  # 4: UDP? else -> 16 reject
        (ldh_abs, 0, 0, 20),  # 5: flags + fragment offset
        (jset, 9, 0, 0x1FFF),  # 6: a later fragment has no UDP header -> 16 reject
        (ldxb_msh, 0, 0, 14),  # 7: X = IP header length
        (ldh_ind, 0, 0, 16),  # 8: UDP dst port
        (jeq, 5, 6, ROCEV2_PORT),  # 9: -> 15 accept / 16 reject
        (jeq, 0, 5, 0x86DD),  # 10: IPv6? else -> 16 reject
        (ldb_abs, 0, 0, 20),  # 11: next header
        (jeq, 0, 3, 17),  # 12: UDP? else -> 16 reject
        (ldh_abs, 0, 0, 56),  # 13: UDP dst port
        (jeq, 0, 1, ROCEV2_PORT),  # 14: -> 15 accept / 16 reject
        (ret, 0, 0, 0x40000),  # 15: accept (whole frame)
        (ret, 0, 0, 0),  # 16: reject
    ]


def attach_filter(sock: socket.socket) -> None:
    program = b"".join(struct.pack("HBBI", code, jt, jf, k) for code, jt, jf, k in _bpf_program())
    buf = ctypes.create_string_buffer(program)
    fprog = struct.pack("HL", len(program) // 8, ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


class AfPacketSource:
    """Frames received on one interface, drained without blocking."""

    def __init__(self, interface: str, sock: socket.socket | None = None) -> None:
        self.sock = sock or socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        attach_filter(self.sock)
        self.sock.bind((interface, 0))
        self.sock.setblocking(False)
        self._drain()  # frames queued before the filter was attached match nothing we promise

    def _drain(self) -> None:
        while True:
            try:
                self.sock.recv(65535)
            except BlockingIOError:
                return

    def read(self, max_frames: int) -> CaptureBatch:
        frames: list[bytes] = []
        while len(frames) < max_frames:
            try:
                data, addr = self.sock.recvfrom(65535)
            except BlockingIOError:
                break
            if addr[2] != PACKET_OUTGOING:  # count what the interface received, not what it sent
                frames.append(data)
        return CaptureBatch(frames, self._dropped())

    def _dropped(self) -> int:
        # struct tpacket_stats {tp_packets, tp_drops}; reading it resets both (packet(7)).
        _packets, drops = struct.unpack("II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        return int(drops)

    def close(self) -> None:
        self.sock.close()


# --- the collector ------------------------------------------------------------------------------


@dataclass
class _Tally:
    max_senders: int
    counts: dict[tuple[str, tuple[tuple[str, str], ...]], int] = field(default_factory=dict)
    senders: set[str] = field(default_factory=set)

    def sender(self, name: str) -> str:
        # Bounded cardinality: a rogue or spoofing sender must not explode the label set.
        if name in self.senders or len(self.senders) < self.max_senders:
            self.senders.add(name)
            return name
        return OTHER

    def add(self, counter: str, value: int, **labels: str) -> None:
        key = (counter, labels_of(labels))
        self.counts[key] = self.counts.get(key, 0) + value

    def record(self, event: FlowControl | Cnp) -> None:
        sender = self.sender(event.sender)
        if isinstance(event, Cnp):
            self.add("cnp_frames", 1, sender=sender, dscp=str(event.dscp))
            return
        for priority, quanta in event.quanta.items():
            if priority is None:
                self.add("pause_frames", 1, sender=sender)
                continue
            kind = "pfc_pause_frames" if quanta else "pfc_resume_frames"
            self.add(kind, 1, priority=str(priority), sender=sender)
            self.add("pfc_pause_quanta", quanta, priority=str(priority), sender=sender)


UNITS = {"pfc_pause_quanta": "quanta", "capture_dropped": "frames"}


@dataclass(frozen=True, slots=True)
class CaptureFactories(CollectorFactories):
    source: Callable[[str], FrameSource] = AfPacketSource  # given the interface name


class CaptureCollector:
    name: ClassVar[str] = "capture"
    extra: ClassVar[str] = "capture"  # scapy decodes the frames (pip install 'fabricd[capture]')
    Options: ClassVar[type[CollectorOptions]] = CaptureOptions

    def __init__(self, ctx: CollectorContext) -> None:
        assert isinstance(ctx.options, CaptureOptions)
        self.options = ctx.options
        self.source = ctx.factories_for(CaptureFactories).source(self.options.interface)
        self.tally = _Tally(self.options.max_senders)
        self.tally.add("capture_dropped", 0)

    async def collect(self) -> Sequence[Reading]:
        batch = self.source.read(self.options.max_frames_per_collect)
        self.tally.add("capture_dropped", batch.dropped)
        for frame in batch.frames:
            event = classify(frame)
            if event is not None:
                self.tally.record(event)
        return [self._reading(counter, labels, value) for (counter, labels), value in self.tally.counts.items()]

    def _reading(self, counter: str, labels: tuple[tuple[str, str], ...], value: int) -> Reading:
        return Reading(
            SOURCE,
            self.options.interface,
            "",
            counter,
            float(value),
            UNITS.get(counter, "frames"),
            kind=Kind.COUNTER,
            labels=labels,
            name=counter,
            width=0,
        )

    async def close(self) -> None:
        close = getattr(self.source, "close", None)
        if close is not None:
            close()
