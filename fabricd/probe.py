"""The pingmesh probe protocol: packet format, the per-peer ledger, the responder and the prober.

Wire format (docs/latency.md), network byte order, 28 bytes plus optional zero padding::

    magic "FDPB" | version u8 | type u8 (0 request, 1 reply) | pad_len u16 | session u32 | seq u64
    | send_ns u64 (the prober's CLOCK_MONOTONIC, nanoseconds)

A responder echoes the request with ``type`` set to reply and nothing else changed, so replies are the
size of requests. ``session`` names one (prober, peer) pair: replies for a session a restarted prober
no longer knows are ignored. RoCEv2-shaped probes put the same payload after a 12-byte InfiniBand BTH
(UD SEND-only) and before a 4-byte ICRC, sent to UDP port 4791 so they hash onto the same ECMP paths
and carry the same DSCP as RDMA traffic (IBTA Annex A17 "RoCEv2"); the payload is still ours.

The per-peer ledger (``fabricd.probe_ledger``) is pure; the protocol classes here do the socket I/O.
"""

from __future__ import annotations

import asyncio
import enum
import socket
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from fabricd.probe_ledger import Ledger
from fabricd.udpstamp import StampedEndpoint

MAGIC = b"FDPB"
VERSION = 1
REQUEST = 0
REPLY = 1
HEADER = struct.Struct("!4sBBHIQQ")
ROCEV2_PORT = 4791  # IANA: RoCEv2
BTH_LEN = 12
ICRC_LEN = 4
UD_SEND_ONLY = 0x64  # BTH opcode: UD transport (0x60) | SEND_ONLY (0x04), IBTA vol 1 table 38
# The session a path trace's packets carry (fabricd.tracing): no prober numbers its peers this high.
# A responder echoes such requests like any probe, and a prober echoes them from its own peers, so a
# trace of a reply's path (from the responder back to the prober) ends when it reaches the prober.
TRACE_SESSION = 0xFFFF_FFFF
PROBERS_KEPT = 4096  # how many probers (address, port) a responder remembers for reply traces
# A request its responder read this long after the kernel queued it was held by a stalled host, not
# delayed by the fabric (the stamp is taken as it reaches the host): far above any host's ordinary
# scheduling delay (milliseconds: docs/detection.md, tail latency), and below the probers' timeouts
# (1 s by default) so that a hold which turned into a prober's loss is counted.
HELD_LATE_NS = 250_000_000


class Shape(enum.StrEnum):
    UDP = "udp"
    ROCEV2 = "rocev2"


@dataclass(frozen=True, slots=True)
class Probe:
    kind: int
    session: int
    seq: int
    send_ns: int
    pad_len: int = 0
    shape: Shape = Shape.UDP


def encode(probe: Probe) -> bytes:
    body = HEADER.pack(MAGIC, VERSION, probe.kind, probe.pad_len, probe.session, probe.seq, probe.send_ns)
    body += bytes(probe.pad_len)
    return _wrap_bth(body, probe.seq) if probe.shape is Shape.ROCEV2 else body


def _wrap_bth(body: bytes, seq: int) -> bytes:
    from scapy.contrib.roce import BTH  # imported lazily: scapy is slow to import
    from scapy.packet import Raw

    # icrc=0: the ICRC covers IP/UDP fields the kernel fills in later; no switch checks it.
    bth = BTH(opcode=UD_SEND_ONLY, dqpn=1, psn=seq & 0xFFFFFF, icrc=0)
    return bytes(bth / Raw(body))


def decode(data: bytes) -> Probe | None:
    """A probe from a datagram (plain or BTH-wrapped), or None for anything else."""
    shape = Shape.UDP
    if data[BTH_LEN : BTH_LEN + 4] == MAGIC and data[:4] != MAGIC:
        data, shape = data[BTH_LEN:-ICRC_LEN], Shape.ROCEV2
    if len(data) < HEADER.size or data[:4] != MAGIC:
        return None
    _magic, version, kind, pad_len, session, seq, send_ns = HEADER.unpack_from(data)
    if version != VERSION or kind not in (REQUEST, REPLY):
        return None
    return Probe(kind, session, seq, send_ns, pad_len, shape)


def reply_to(probe: Probe) -> bytes:
    return encode(Probe(REPLY, probe.session, probe.seq, probe.send_ns, probe.pad_len, probe.shape))


# --- sockets ------------------------------------------------------------------------------------


class SocketFactory(Protocol):
    """Makes an unbound UDP socket; the lab's version makes it inside a network namespace."""

    def __call__(self, family: int) -> socket.socket: ...


def plain_udp_socket(family: int) -> socket.socket:
    return socket.socket(family, socket.SOCK_DGRAM)


def set_dscp(sock: socket.socket, dscp: int | None) -> None:
    if dscp is not None:  # DSCP is the upper 6 bits of the TOS / traffic class byte (RFC 2474)
        level, opt = (
            (socket.IPPROTO_IPV6, socket.IPV6_TCLASS)
            if sock.family == socket.AF_INET6
            else (socket.IPPROTO_IP, socket.IP_TOS)
        )
        sock.setsockopt(level, opt, dscp << 2)


ReplyFilter = Callable[[Probe], bool]


def always_reply(_probe: Probe) -> bool:
    return True


class ResponderProtocol(asyncio.DatagramProtocol):
    """Answers every probe request it receives (that the filter lets through), and counts those it
    read ``HELD_LATE_NS`` or more after they arrived (``late_answers``: its host stalled, and its
    probers may have counted them lost; ``fabricd.detect.responders``)."""

    def __init__(self, reply_filter: ReplyFilter = always_reply) -> None:
        self.reply_filter = reply_filter
        self.transport: StampedEndpoint | asyncio.DatagramTransport | None = None
        # (address, source port) -> when its last probe came (monotonic s): whose replies to trace
        self.probers: OrderedDict[tuple[str, int], float] = OrderedDict()
        self.late_answers = 0

    def connection_made(self, transport: Any) -> None:
        # ``start_responder``'s StampedEndpoint, or an asyncio transport (cast, not isinstance: 3.11's
        # selector datagram transport does not subclass DatagramTransport).
        self.transport = cast(StampedEndpoint | asyncio.DatagramTransport, transport)

    def stamped_received(self, data: bytes, addr: Any, arrival_ns: int) -> None:
        """A datagram with the kernel's arrival time on the monotonic clock (``start_responder``)."""
        if time.monotonic_ns() - arrival_ns >= HELD_LATE_NS:
            self.late_answers += 1
        self.datagram_received(data, addr)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        probe = decode(data)
        if probe is None or probe.kind != REQUEST or self.transport is None:
            return
        if probe.session != TRACE_SESSION:
            self._heard(addr)
        self.respond(probe, addr)

    def _heard(self, addr: Any) -> None:
        key = (str(addr[0]), int(addr[1]))
        self.probers[key] = time.monotonic()
        self.probers.move_to_end(key)
        if len(self.probers) > PROBERS_KEPT:
            self.probers.popitem(last=False)  # the longest silent

    def respond(self, probe: Probe, addr: Any) -> None:
        """Answer one valid request now (subclasses may delay or drop it: the simulator's path model)."""
        if self.reply_filter(probe):
            self.send(reply_to(probe), addr)

    def send(self, data: bytes, addr: Any) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(data, addr)


def drop_every(k: int) -> ReplyFilter:
    """A reply filter that drops every k-th request it sees: a known, exact amount of loss."""
    seen = 0

    def keep(_probe: Probe) -> bool:
        nonlocal seen
        seen += 1
        return seen % k != 0

    return keep


async def start_responder(sock: socket.socket, protocol: ResponderProtocol) -> StampedEndpoint:
    """Answer on ``sock``, reading it with kernel receive times (``fabricd.udpstamp``) so that the
    responder knows how long its host held each request; close the returned endpoint to stop."""
    endpoint = StampedEndpoint(sock, protocol.stamped_received, protocol.error_received, time.monotonic_ns)
    endpoint.start(asyncio.get_running_loop())
    protocol.connection_made(endpoint)
    return endpoint


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    address: str
    port: int
    rate_per_second: float


class ProberProtocol(asyncio.DatagramProtocol):
    """Sends probes to every target at its rate from one socket and feeds replies to the ledgers."""

    def __init__(
        self,
        targets: Iterable[Target],
        timeout_ns: int,
        *,
        shape: Shape = Shape.UDP,
        pad_len: int = 0,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        session_base: int = 0,
    ) -> None:
        self.targets = {session_base + i: t for i, t in enumerate(targets)}
        self.ledgers = {s: Ledger(timeout_ns) for s in self.targets}
        self.addresses = {t.address for t in self.targets.values()}
        self.shape, self.pad_len, self.clock_ns = shape, pad_len, clock_ns
        self.transport: StampedEndpoint | asyncio.DatagramTransport | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.socket_drops = 0  # datagrams the socket dropped since the prober started (its replies)
        if shape is Shape.ROCEV2:
            # Import scapy now, not in the first send: send_one reads the clock before encoding,
            # and a 1-2 s import there put the first probe past its timeout (lost, then late).
            encode(Probe(REQUEST, 0, 0, 0, 0, shape))

    def connection_made(self, transport: Any) -> None:
        # ``start_prober``'s StampedEndpoint, or an asyncio transport (cast, not isinstance: 3.11's
        # selector datagram transport does not subclass DatagramTransport).
        self.transport = cast(StampedEndpoint | asyncio.DatagramTransport, transport)
        # Each target's probes start a fraction of their interval after the previous target's, so
        # the prober sends one probe at a time instead of a burst to every peer per interval (as
        # kubeservice-stack/pingmesh-agent spreads its probe jobs over the interval, and tinc sends
        # "one MTU probe at a time"): a burst reaches its first peer alone and the rest right behind
        # it, so each path got the hosts' wake-up delays by its place in the burst, not by its own
        # (live, a prober's first path sat 200 us above its others; docs/latency.md).
        count = len(self.targets)
        self.tasks = [asyncio.create_task(self._pace(s, k / count)) for k, s in enumerate(self.targets)]

    def datagram_received(self, data: bytes, addr: Any, arrival_ns: int | None = None) -> None:
        """A datagram, with the time it reached the host when known (``fabricd.udpstamp``; None
        for a reply a path trace's socket took and handed on: timed when read)."""
        probe = decode(data)
        if probe is None:
            return
        if probe.kind == REPLY and probe.session in self.ledgers:
            self.ledgers[probe.session].on_reply(probe.seq, self.clock_ns(), arrival_ns)
        elif probe.kind == REQUEST and probe.session == TRACE_SESSION and addr[0] in self.addresses:
            self._echo(probe, addr)

    def _echo(self, probe: Probe, addr: Any) -> None:
        """A peer tracing the path of its replies to us: the echo tells its trace it arrived."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(reply_to(probe), addr)

    def error_received(self, exc: Exception) -> None:
        pass  # ICMP unreachable from a peer with no responder: nothing to do, its probes time out

    def host_dropped(self, count: int) -> None:
        """The socket dropped ``count`` more datagrams (``StampedEndpoint``): replies, most likely,
        of any probe in flight now."""
        self.socket_drops += count
        for ledger in self.ledgers.values():
            ledger.on_host_drop()

    def send_one(self, session: int, seq: int) -> None:
        target, now = self.targets[session], self.clock_ns()
        data = encode(Probe(REQUEST, session, seq, now, self.pad_len, self.shape))
        assert self.transport is not None
        self.ledgers[session].on_send(seq, now)
        if self.transport.sendto(data, (target.address, target.port)) is False:  # asyncio's: None
            self.ledgers[session].on_unsent(seq)

    async def _pace(self, session: int, phase: float = 0.0) -> None:
        # Absolute schedule (start + k / rate): a slow loop iteration does not lower the rate.
        interval = 1.0 / self.targets[session].rate_per_second
        loop = asyncio.get_running_loop()
        start, seq = loop.time() + phase * interval, 0
        await asyncio.sleep(max(0.0, start - loop.time()))
        while True:
            self.send_one(session, seq)
            seq += 1
            await asyncio.sleep(max(0.0, start + seq * interval - loop.time()))

    def stop_sending(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.tasks = []

    def drain(self) -> None:
        """Take the replies already in the socket before a scrape expires their probes: after a
        stall the scrape may run before the reader does, and would count them lost."""
        if isinstance(self.transport, StampedEndpoint):
            self.transport.drain()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_sending()


async def start_prober(sock: socket.socket, protocol: ProberProtocol) -> StampedEndpoint:
    """Read ``sock`` with kernel receive times (``fabricd.udpstamp``) and start ``protocol``'s
    probes; close the returned endpoint to stop reading."""
    endpoint = StampedEndpoint(
        sock, protocol.datagram_received, protocol.error_received, protocol.clock_ns, protocol.host_dropped
    )
    endpoint.start(asyncio.get_running_loop())
    protocol.connection_made(endpoint)
    return endpoint
