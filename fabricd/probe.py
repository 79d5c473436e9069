"""The pingmesh probe protocol: packet format, the per-peer ledger, the responder and the prober.

Wire format (docs/latency.md), network byte order, 28 bytes plus optional zero padding::

    magic "FDPB" | version u8 | type u8 (0 request, 1 reply) | pad_len u16 | session u32 | seq u64
    | send_ns u64 (the prober's CLOCK_MONOTONIC, nanoseconds)

A responder echoes the request with ``type`` set to reply and nothing else changed, so replies are the
size of requests. ``session`` names one (prober, peer) pair: replies for a session a restarted prober
no longer knows are ignored. RoCEv2-shaped probes put the same payload after a 12-byte InfiniBand BTH
(UD SEND-only) and before a 4-byte ICRC, sent to UDP port 4791 so they hash onto the same ECMP paths
and carry the same DSCP as RDMA traffic (IBTA Annex A17 "RoCEv2"); the payload is still ours.

The ledger is pure (times passed in); the protocol classes do the socket I/O.
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

from hdrh.histogram import HdrHistogram

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
HIST_MAX_US = 60_000_000  # RTTs above 60 s are clamped (a probe times out long before)
# 2 significant digits: quantiles within 1 %, which is finer than RTT jitter; 3 digits made the
# pure-Python histogram 4x slower to query and reset, ~2-5 ms per peer per scrape on the agent's
# event loop (the loop that also answers probes).
HIST_DIGITS = 2
EXPIRED_KEEP = 65536  # how many timed-out sequence numbers to remember for late-reply accounting
# The session a path trace's packets carry (fabricd.tracing): no prober numbers its peers this high.
# A responder echoes such requests like any probe, and a prober echoes them from its own peers, so a
# trace of a reply's path (from the responder back to the prober) ends when it reaches the prober.
TRACE_SESSION = 0xFFFF_FFFF
PROBERS_KEPT = 4096  # how many probers (address, port) a responder remembers for reply traces


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


# --- accounting ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RttSummary:
    """RTT over one collect interval, in seconds."""

    count: int
    min: float
    p50: float
    p90: float
    p99: float
    max: float


@dataclass(frozen=True, slots=True)
class PeerCounts:
    """Cumulative since the prober started: sent = received + lost + in flight."""

    sent: int
    received: int
    lost: int
    late: int
    out_of_order: int
    duplicate: int
    in_flight: int


class Ledger:
    """Exact per-peer accounting of probes, from sequence numbers and times passed in (pure).

    A probe is received once (duplicates ignored), lost once when its timeout passes, and a reply
    that arrives after that is counted as ``late`` only, never also as received. ``out_of_order``
    counts replies whose sequence number is below the highest one already received.
    """

    def __init__(self, timeout_ns: int) -> None:
        self.timeout_ns = timeout_ns
        self.outstanding: OrderedDict[int, int] = OrderedDict()  # seq -> send time (ns), in send order
        self.expired: OrderedDict[int, None] = OrderedDict()
        self.sent = self.received = self.lost = self.late = self.out_of_order = self.duplicate = 0
        self.highest = -1
        self.hist = HdrHistogram(1, HIST_MAX_US, HIST_DIGITS)
        self.rtt_min_ns: int | None = None
        self.rtt_max_ns = 0

    def on_send(self, seq: int, now_ns: int) -> None:
        self.sent += 1
        self.outstanding[seq] = now_ns

    def on_reply(self, seq: int, now_ns: int, arrival_ns: int | None = None) -> None:
        """A reply read at ``now_ns`` that reached the host at ``arrival_ns`` (the kernel's stamp;
        None: unknown, taken as ``now_ns``).

        On time means it *arrived* within the timeout: a prober whose event loop stalled reads
        late the replies that came meanwhile, and must not count them lost. Its RTT is the read
        time's, on which the delay detectors' thresholds were measured (docs/latency.md), except
        for a reply read after its timeout had passed: that one is timed at its arrival (the
        stall is the prober's, not the path's)."""
        arrived = now_ns if arrival_ns is None else min(arrival_ns, now_ns)
        self.expire(arrived)
        sent_ns = self.outstanding.pop(seq, None)
        if sent_ns is None:
            self._unexpected(seq)
            return
        self.received += 1
        if seq < self.highest:
            self.out_of_order += 1
        self.highest = max(self.highest, seq)
        rtt_ns = now_ns - sent_ns
        self._record(rtt_ns if rtt_ns < self.timeout_ns else arrived - sent_ns)

    def _unexpected(self, seq: int) -> None:
        if seq in self.expired:
            del self.expired[seq]  # a second copy of a late reply is a duplicate, not late again
            self.late += 1
        else:
            self.duplicate += 1

    def _record(self, rtt_ns: int) -> None:
        self.hist.record_value(min(HIST_MAX_US, max(1, round(rtt_ns / 1000))))
        self.rtt_min_ns = rtt_ns if self.rtt_min_ns is None else min(self.rtt_min_ns, rtt_ns)
        self.rtt_max_ns = max(self.rtt_max_ns, rtt_ns)

    def expire(self, now_ns: int) -> None:
        while self.outstanding:
            seq, sent_ns = next(iter(self.outstanding.items()))
            if now_ns - sent_ns < self.timeout_ns:
                return  # send order = time order: the rest are younger
            del self.outstanding[seq]
            self.lost += 1
            self.expired[seq] = None
            if len(self.expired) > EXPIRED_KEEP:
                self.expired.popitem(last=False)

    def counts(self) -> PeerCounts:
        return PeerCounts(
            self.sent, self.received, self.lost, self.late, self.out_of_order, self.duplicate, len(self.outstanding)
        )

    def take_rtt(self) -> RttSummary | None:
        """The interval's RTT summary, and a fresh interval; None when nothing came back."""
        count = self.hist.get_total_count()
        if not count or self.rtt_min_ns is None:
            return None
        pct = self.hist.get_percentile_to_value_dict([50, 90, 99])  # one pass over the buckets
        lo, hi = self.rtt_min_ns / 1e9, self.rtt_max_ns / 1e9
        # The histogram answers a bucket's highest value, up to 1/128 over the sample at 2 digits (a
        # p99 of 1343 us beside a 1340.9 us max); clamped, the five gauges stay ordered.
        p50, p90, p99 = (min(hi, max(lo, pct[q] / 1e6)) for q in (50, 90, 99))
        summary = RttSummary(count, lo, p50, p90, p99, hi)
        self.hist.reset()
        self.rtt_min_ns, self.rtt_max_ns = None, 0
        return summary


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
    """Answers every probe request it receives (that the filter lets through)."""

    def __init__(self, reply_filter: ReplyFilter = always_reply) -> None:
        self.reply_filter = reply_filter
        self.transport: asyncio.DatagramTransport | None = None
        # (address, source port) -> when its last probe came (monotonic s): whose replies to trace
        self.probers: OrderedDict[tuple[str, int], float] = OrderedDict()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # cast, not isinstance: 3.11's selector datagram transport does not subclass DatagramTransport.
        self.transport = cast(asyncio.DatagramTransport, transport)

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


async def start_responder(sock: socket.socket, protocol: ResponderProtocol) -> asyncio.DatagramTransport:
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    transport, _ = await loop.create_datagram_endpoint(lambda: protocol, sock=sock)
    return transport


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
        if shape is Shape.ROCEV2:
            # Import scapy now, not in the first send: send_one reads the clock before encoding,
            # and a 1-2 s import there put the first probe past its timeout (lost, then late).
            encode(Probe(REQUEST, 0, 0, 0, 0, shape))

    def connection_made(self, transport: Any) -> None:
        # ``start_prober``'s StampedEndpoint, or an asyncio transport (cast, not isinstance: 3.11's
        # selector datagram transport does not subclass DatagramTransport).
        self.transport = cast(StampedEndpoint | asyncio.DatagramTransport, transport)
        self.tasks = [asyncio.create_task(self._pace(s)) for s in self.targets]

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

    def send_one(self, session: int, seq: int) -> None:
        target, now = self.targets[session], self.clock_ns()
        data = encode(Probe(REQUEST, session, seq, now, self.pad_len, self.shape))
        assert self.transport is not None
        self.ledgers[session].on_send(seq, now)
        self.transport.sendto(data, (target.address, target.port))

    async def _pace(self, session: int) -> None:
        # Absolute schedule (start + k / rate): a slow loop iteration does not lower the rate.
        interval = 1.0 / self.targets[session].rate_per_second
        loop = asyncio.get_running_loop()
        start, seq = loop.time(), 0
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
    endpoint = StampedEndpoint(sock, protocol.datagram_received, protocol.error_received, protocol.clock_ns)
    endpoint.start(asyncio.get_running_loop())
    protocol.connection_made(endpoint)
    return endpoint
