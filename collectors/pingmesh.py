"""Pingmesh collector: UDP echo probes to a peer list, and a responder answering everyone else's.

Per peer (``device`` = peer name) every collect reports cumulative ``probes_sent``,
``probes_received``, ``probes_lost`` (timed out; reported once the timeout passed again, at most
``LOSS_SETTLE_MAX_SECONDS`` more), ``probes_late`` (a reply after the timeout; already counted lost,
never counted received: lost less late is the probes never answered), ``probes_out_of_order``, and
the interval's RTT ``rtt_min``, ``rtt_p50``, ``rtt_p90``, ``rtt_p99``, ``rtt_max`` in seconds (an
HDR histogram, reset each collect; absent when no reply came back in the interval: no honest RTT
exists then), and ``probes_host_dropped``: unanswered probes this host may have dropped itself (not
sent for a full socket buffer, or in flight while the prober's socket dropped datagrams;
``fabricd.probe_ledger.Ledger``), counted neither received nor lost. An agent that answers
probes reports, with ``device`` empty, ``responder_start_time`` (Unix seconds): when its responder
began answering, so that the central can tell probes its peers lost while it was not running (an
agent's restart, the fleet's start) from probes the fabric dropped (``fabricd.detect.responders``).
With ``device`` empty too, ``prober_socket_drops`` and ``responder_socket_drops`` count the
datagrams each socket dropped (its receive queue full: the agent read too slowly;
``fabricd.udpstamp``), and ``responder_late_answers`` the requests the responder read
``fabricd.probe.HELD_LATE_NS`` or more after they arrived (its agent stalled). Both sockets'
queues are sized to hold ``QUEUE_HELD_SECONDS`` of the mesh's datagrams, so that a stalled agent
reads them late rather than loses them.

Side effects come from ``PingmeshFactories``: ``socket`` (``fabricd.probe.SocketFactory``; the netns
lab passes one that opens sockets inside a host namespace), ``responder`` (the responder protocol;
tests pass one that drops a known number of replies) and ``prober`` (``fabricd eval`` plugs in a
path-model prober). The probing starts on the first ``collect()``.

Path tracing (``trace_paths``, on by default; IPv4 peers): each pair's 5-tuple is traced at start,
when the pair turns bad and every ``trace_refresh_seconds`` (``fabricd.tracing``), and each trace is
reported once, in the next collect, as ``path_info`` (``device`` = peer; labels ``src``,
``src_port``, ``dst``, ``dst_port``, ``hops``: the hop addresses in TTL order, space separated,
``*`` for a silent hop; ``reached``; ``reason``). Addresses are sent raw: the central maps them to
topology elements (docs/topology.md, "Traced paths"). The responder traces the path of its replies
to each prober it hears, with the reply's 5-tuple, reported the same way with ``direction`` =
``reply`` (``device`` = the prober's peer name, else its address; ``src`` is this node's end).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import socket
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fabricd.collector import CollectorContext, CollectorFactories, CollectorOptions
from fabricd.model import Kind, Reading, labels_of
from fabricd.probe import (
    ProberProtocol,
    ResponderProtocol,
    Shape,
    SocketFactory,
    Target,
    plain_udp_socket,
    set_dscp,
    start_prober,
    start_responder,
)
from fabricd.tracing import PathTracer, Replies, TracedPath, TraceParams, TracePolicy
from fabricd.udpport import bind_own_port
from fabricd.udpstamp import StampedEndpoint, receive_buffer, socket_drops

SOURCE = "pingmesh"
DEFAULT_PORT = 19471
DEFAULT_RATE = 10.0  # probes/s per peer within a rack (Pingmesh, SIGCOMM 2015); configure less across
# A pair "turns bad" for tracing when a probe was lost in the interval, or its RTT p99 is this many
# times its median p99 over the last BAD_HISTORY intervals. A false trigger costs one trace (rate
# limited), a missed one a stale path, so the bar is low: a loaded host's scheduling stalls move p99
# by 2-3x (docs/detection.md, tail latency), a queue building behind a fault by 10x and more.
BAD_P99_FACTOR = 4.0
BAD_HISTORY = 30
# A socket's receive queue holds this long of its datagrams at the mesh's rates: a stall shorter
# than that is read late, its replies stamped on arrival (fabricd.udpstamp), not dropped. The
# kernel's default queue (net.core.rmem_default, 208 KiB) held 256 probes (832 bytes each, measured
# on loopback: tests/test_udpstamp.py), 1.1 s of 24 peers at 10/s. 10 s is ten times the longest
# stall measured (the first 4-11 probes at 10/s of a loaded demo's start: fabricd/udpstamp.py); a
# longer one's drops are counted as the host's (``probes_host_dropped``). The kernel charges a
# datagram its whole buffer: its length plus ``DATAGRAM_OVERHEAD_BYTES`` (832 - 28 measured,
# rounded up). Queue memory is charged only while datagrams wait, so the bounds cap a stall's
# worst case, not the agent's footprint: at least ``QUEUE_MIN_BYTES`` (about 4,000 probes: a
# responder's probers are not in its configuration, and one that only answers may be probed by
# hundreds), at most ``QUEUE_MAX_BYTES``.
QUEUE_HELD_SECONDS = 10.0
DATAGRAM_OVERHEAD_BYTES = 1024
QUEUE_MIN_BYTES = 4 * 1024 * 1024
QUEUE_MAX_BYTES = 64 * 1024 * 1024
log = logging.getLogger(__name__)


class PeerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    address: str
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    rate_per_second: float = Field(default=DEFAULT_RATE, gt=0, le=1000)

    @field_validator("address")
    @classmethod
    def _ip(cls, value: str) -> str:
        ipaddress.ip_address(value)  # a literal address: no DNS lookups on the probe path
        return value


class PingmeshOptions(CollectorOptions):
    peers: list[PeerOptions] = Field(default_factory=list, max_length=4096)
    listen_address: str = "0.0.0.0"
    listen_port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    respond: bool = True
    timeout_seconds: float = Field(default=1.0, gt=0, le=60)
    dscp: int | None = Field(default=None, ge=0, le=63)
    shape: Shape = Shape.UDP
    payload_bytes: int = Field(default=0, ge=0, le=8000)
    # Path tracing with each probe's 5-tuple (fabricd.tracing); IPv4 peers only.
    trace_paths: bool = True
    trace_refresh_seconds: float = Field(default=600.0, gt=0)
    trace_pair_interval_seconds: float = Field(default=60.0, ge=0)
    trace_rate_per_second: float = Field(default=1.0, gt=0, le=100)
    trace_max_hops: int = Field(default=16, ge=1, le=64)
    trace_timeout_seconds: float = Field(default=1.0, gt=0, le=10)

    @field_validator("peers")
    @classmethod
    def _unique(cls, peers: list[PeerOptions]) -> list[PeerOptions]:
        names = [p.name for p in peers]
        if len(set(names)) != len(names):
            raise ValueError("peer names must be unique")
        return peers


# A probe is counted lost at a scrape once its timeout passed this much earlier (at most its timeout
# again), so that a reply held up past the timeout by a stalled host comes back, and is counted
# ``late``, in the same scrape as its loss: the detectors count a probe lost and late as answered
# (``fabricd.signal_math.loss_ratio``), and a stall straddling a scrape put the loss in one scrape
# and the late reply in the next, where a per-scrape ratio cannot take it back. A loss is reported
# up to this much later; a stall longer than the timeout and this together still straddles.
LOSS_SETTLE_MAX_SECONDS = 2.0


def _family(address: str) -> int:
    return socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET


def _counter(peer: str, name: str, value: int, unit: str = "probes") -> Reading:
    return Reading(SOURCE, peer, "", name, float(value), unit, kind=Kind.COUNTER, name=name, width=0)


def queue_bytes(rate_per_second: float, datagram_bytes: int) -> int:
    """The receive queue that holds ``QUEUE_HELD_SECONDS`` of datagrams at ``rate_per_second``."""
    need = rate_per_second * QUEUE_HELD_SECONDS * (datagram_bytes + DATAGRAM_OVERHEAD_BYTES)
    return int(min(QUEUE_MAX_BYTES, max(QUEUE_MIN_BYTES, need)))


def _gauge(peer: str, name: str, seconds: float) -> Reading:
    return Reading(SOURCE, peer, "", name, seconds, "seconds", kind=Kind.GAUGE, name=f"{name}_seconds", width=0)


@dataclass(frozen=True, slots=True)
class PingmeshFactories(CollectorFactories):
    socket: SocketFactory = plain_udp_socket
    responder: Callable[[], ResponderProtocol] = ResponderProtocol
    # The probe sender, ``(targets, timeout_ns) -> prober`` with ProberProtocol's ledger interface;
    # None: real UDP probes from a ``socket``. The simulator's eval plugs in a path-model prober so
    # a simulated hour replays in seconds through this same collector.
    prober: Callable[[list[Target], int], Any] | None = None


class PingmeshCollector:
    name: ClassVar[str] = "pingmesh"
    Options: ClassVar[type[CollectorOptions]] = PingmeshOptions

    def __init__(self, ctx: CollectorContext) -> None:
        assert isinstance(ctx.options, PingmeshOptions)
        self.options = ctx.options
        factories = ctx.factories_for(PingmeshFactories)
        self.socket_factory = factories.socket
        self.responder_factory = factories.responder
        self.prober_factory = factories.prober
        self.prober: Any = None  # ProberProtocol, or what prober_factory built (same ledger interface)
        self.responder: ResponderProtocol | None = None
        self.responder_socket: socket.socket | None = None
        self.responder_started = 0.0  # Unix time the responder began answering (reported: fabricd.detect.responders)
        self.transports: list[asyncio.DatagramTransport | StampedEndpoint] = []
        self.tracer: PathTracer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._lost: dict[str, int] = {}  # peer -> probes lost at the last collect
        self._p99s: dict[str, deque[float]] = {}  # peer -> its last intervals' RTT p99

    async def start(self, probe: bool = True) -> None:
        """Open the responder, then (``probe``) start probing; ``start(probe=False)`` on every agent
        of a mesh first avoids losing the first probes to peers whose responder is not up yet."""
        if self.options.respond and self.responder is None:
            await self._start_responder()
        if probe and self.options.peers and self.prober is None:
            await self._start_prober()

    async def _start_responder(self) -> None:
        family = _family(self.options.listen_address)
        sock = self.socket_factory(family)
        tracing = self._tracing(family)
        if tracing:  # reply traces bind the responder's port beside it (fabricd.tracing)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if tracing and self.options.listen_port == 0:
            bind_own_port(sock, self.options.listen_address)
        else:
            sock.bind((self.options.listen_address, self.options.listen_port))
        set_dscp(sock, self.options.dscp)  # replies travel in the same class as the requests
        self._size_queue(sock)
        self.responder_socket = sock
        self.responder = self.responder_factory()
        transport = await start_responder(sock, self.responder)
        self.transports.append(transport)
        self.responder_started = time.time()

    def _size_queue(self, sock: socket.socket) -> None:
        """Size ``sock``'s receive queue for the mesh: this node's probes a second to every peer (the
        replies that come back; a responder's probers are unknown, and a mesh is symmetric, so these
        rates stand for theirs) of the probes' size (28 bytes, the padding, RoCEv2's BTH and ICRC)."""
        rate = sum(p.rate_per_second for p in self.options.peers) or DEFAULT_RATE
        size = 28 + self.options.payload_bytes + (16 if self.options.shape is Shape.ROCEV2 else 0)
        receive_buffer(sock, queue_bytes(rate, size))

    def _tracing(self, family: int) -> bool:
        return self.options.trace_paths and family == socket.AF_INET and self.prober_factory is None

    async def _start_prober(self) -> None:
        peers = self.options.peers
        targets = [Target(p.name, p.address, p.port, p.rate_per_second) for p in peers]
        timeout_ns = int(self.options.timeout_seconds * 1e9)
        if self.prober_factory is not None:
            self.prober = self.prober_factory(targets, timeout_ns)
            return
        family = _family(peers[0].address)
        sock = self.socket_factory(family)
        set_dscp(sock, self.options.dscp)
        self._size_queue(sock)
        tracing = self._tracing(family)
        if tracing:  # the trace sockets share the probes' source port (fabricd.tracing)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            bind_own_port(sock, "0.0.0.0")
        self.prober = ProberProtocol(targets, timeout_ns, shape=self.options.shape, pad_len=self.options.payload_bytes)
        self.transports.append(await start_prober(sock, self.prober))
        if tracing:
            self._start_tracer(targets, int(sock.getsockname()[1]))
        elif self.options.trace_paths:
            log.warning("pingmesh: path tracing is IPv4 only; not tracing the IPv6 peers")

    def _start_tracer(self, targets: list[Target], src_port: int | None) -> None:
        o = self.options
        params = TraceParams(
            o.trace_refresh_seconds,
            o.trace_pair_interval_seconds,
            o.trace_rate_per_second,
            o.trace_max_hops,
            o.trace_timeout_seconds,
        )
        policy = TracePolicy(params, [t.name for t in targets], time.monotonic(), random.Random())
        passer = self.prober.datagram_received if self.prober is not None else _drop
        replies = None
        if self.responder is not None and self._tracing(_family(o.listen_address)):
            replies = Replies(self.listen_port, self.responder.datagram_received)
        self.tracer = PathTracer(
            targets, src_port, policy, self.socket_factory, passer, o.shape, o.dscp, replies=replies
        )
        self._tasks.append(asyncio.create_task(self.tracer.run()))

    @property
    def listen_port(self) -> int:
        """The responder's bound port (useful with ``listen_port: 0``)."""
        assert self.transports and self.responder is not None
        return int(self.transports[0].get_extra_info("sockname")[1])

    async def collect(self) -> Sequence[Reading]:
        await self.start()
        if self.tracer is None and self.responder is not None and self._tracing(_family(self.options.listen_address)):
            self._start_tracer([], None)  # an agent that only answers still traces its replies
        out: list[Reading] = []
        if self.prober is not None:
            now = self.prober.clock_ns()
            self.prober.drain()
            for session, target in self.prober.targets.items():
                out.extend(self._peer_readings(target.name, session, now))
        if self.tracer is not None:
            if self.responder is not None:
                self.tracer.learn(self.responder.probers, time.monotonic())
            out.extend(path_reading(p) for p in self.tracer.take())
        if self.responder is not None:
            out.append(_gauge("", "responder_start_time", self.responder_started))
        out.extend(self._host_counts())
        return out

    def _host_counts(self) -> list[Reading]:
        """What this host did to the probes: each socket's dropped datagrams (the prober's as its
        endpoint counted them, from start) and the requests the responder held."""
        out = []
        if self.responder is not None:
            out.append(_counter("", "responder_late_answers", self.responder.late_answers))
        drops = getattr(self.prober, "socket_drops", None)  # a path-model prober has no socket
        if drops is not None:
            out.append(_counter("", "prober_socket_drops", drops, "datagrams"))
        if self.responder_socket is not None and (count := socket_drops(self.responder_socket)) is not None:
            out.append(_counter("", "responder_socket_drops", count, "datagrams"))
        return out

    @property
    def _settle_ns(self) -> int:
        return int(min(self.options.timeout_seconds, LOSS_SETTLE_MAX_SECONDS) * 1e9)

    def _watch(self, peer: str, lost: int, p99: float | None) -> None:
        """Mark a pair bad for the tracer (``BAD_P99_FACTOR``): probes never answered, or a p99 jump."""
        if self.tracer is None:
            return
        history = self._p99s.setdefault(peer, deque(maxlen=BAD_HISTORY))
        jumped = p99 is not None and len(history) >= 3 and p99 > BAD_P99_FACTOR * statistics.median(history)
        if lost > self._lost.get(peer, lost) or jumped:
            self.tracer.policy.mark_bad(peer, self.tracer.clock())
        self._lost[peer] = lost
        if p99 is not None:
            history.append(p99)

    def _peer_readings(self, peer: str, session: int, now_ns: int) -> list[Reading]:
        assert self.prober is not None
        ledger = self.prober.ledgers[session]
        ledger.expire(now_ns - self._settle_ns)
        c = ledger.counts()
        out = [
            _counter(peer, "probes_sent", c.sent),
            _counter(peer, "probes_received", c.received),
            _counter(peer, "probes_lost", c.lost),
            _counter(peer, "probes_late", c.late),
            _counter(peer, "probes_out_of_order", c.out_of_order),
            _counter(peer, "probes_host_dropped", c.host_dropped),
        ]
        rtt = ledger.take_rtt()
        self._watch(peer, c.lost - c.late, rtt.p99 if rtt is not None else None)
        if rtt is not None:
            for name, value in (
                ("rtt_min", rtt.min),
                ("rtt_p50", rtt.p50),
                ("rtt_p90", rtt.p90),
                ("rtt_p99", rtt.p99),
                ("rtt_max", rtt.max),
            ):
                out.append(_gauge(peer, name, value))
        return out

    def stop_probing(self) -> None:
        """Stop sending (the responder keeps answering): lets a caller drain in-flight probes."""
        if self.prober is not None:
            self.prober.stop_sending()

    async def close(self) -> None:
        self.stop_probing()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for transport in self.transports:
            transport.close()
        self.transports = []
        await asyncio.sleep(0)  # let the cancelled pacing tasks finish


def path_reading(p: TracedPath) -> Reading:
    """One trace as an info reading (the central stores it apart from the series: docs/topology.md)."""
    labels = labels_of(
        {
            "src": p.src,
            "src_port": str(p.src_port),
            "dst": p.dst,
            "dst_port": str(p.dst_port),
            "hops": " ".join(h.address or "*" for h in p.hops),
            "reached": "true" if p.hops and p.hops[-1].reached else "false",
            "reason": p.reason,
            **({"direction": p.direction} if p.direction != "request" else {}),
        }
    )
    return Reading(SOURCE, p.peer, "", "path", 1.0, "", Kind.INFO, labels, "path_info", 0)


def _drop(_data: bytes, _addr: Any) -> None:
    """No prober to hand a datagram to (an agent that only answers)."""
