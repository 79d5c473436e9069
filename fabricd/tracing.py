"""Path tracing beside the pingmesh probes (issue 16 §4): which pair to trace when, and the trace.

Each probed pair is traced with the probe's own 5-tuple (``fabricd.pathtrace``), so ECMP hashes
the trace down the probe's path: a socket bound to the prober's source address and port
(``SO_REUSEPORT``: the prober's socket keeps both) and connected to the peer's responder. Linux
delivers a datagram to the connected socket before the wildcard one, so while the trace runs the
peer's ICMP errors and replies reach it; replies to the prober's own probes are handed back to the
prober at once (same event loop: their RTT is not delayed), the others are the trace's.

When (``TracePolicy``, pure: times passed in):

- *start*: every pair once, when probing starts;
- *bad*: a pair whose probes were lost, or whose RTT p99 jumped, in a scrape interval (a fault on
  its path, or a re-route onto another link), at most once per ``pair_interval_seconds``;
- *refresh*: every ``refresh_seconds`` (a re-route on a Clos keeps the path's length, so neither
  the hop count nor the reply TTL would show it: only a new trace does).

A token bucket (``rate_per_second``, ``BURST``) bounds traces per agent, so a storm of bad pairs
never floods the switches' control planes with TTL-expired packets (their ICMP generation is rate
limited, and a silenced hop would read as a silent one); traces run one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fabricd.pathtrace import Hop, Passer, trace_async
from fabricd.probe import REPLY, REQUEST, Probe, Shape, SocketFactory, Target, decode, encode, set_dscp

log = logging.getLogger(__name__)
TRACE_SESSION = 0xFFFF_FFFF  # the probe session trace packets carry (no prober numbers this high)
BURST = 5  # traces the bucket lets through at once (a new agent's first pairs)
IDLE_SECONDS = 1.0  # how often the runner looks for due traces when none is due


@dataclass(frozen=True, slots=True)
class TraceParams:
    refresh_seconds: float = 600.0
    pair_interval_seconds: float = 60.0
    rate_per_second: float = 1.0
    max_hops: int = 16
    timeout_seconds: float = 1.0
    attempts: int = 2


@dataclass(frozen=True, slots=True)
class TracedPath:
    """One trace of a probed pair's 5-tuple; ``hops`` in TTL order."""

    peer: str
    src: str
    src_port: int
    dst: str
    dst_port: int
    hops: tuple[Hop, ...]
    reason: str  # start, bad, refresh


class TracePolicy:
    """Which peer to trace next, and why (pure)."""

    def __init__(self, params: TraceParams, peers: Sequence[str], now: float) -> None:
        self.params = params
        self.never = list(peers)  # traced at start, in peer order
        self.last: dict[str, float] = {}  # peer -> when its last trace started
        self.bad: dict[str, float] = {}  # peer -> when it turned bad (not traced since)
        self.tokens, self.tokens_ts = float(BURST), now

    def mark_bad(self, peer: str, now: float) -> None:
        self.bad.setdefault(peer, now)

    def next_due(self, now: float) -> tuple[str, str] | None:
        """The peer to trace now and why, taking a token; None when none is due or none is left."""
        self.tokens = min(float(BURST), self.tokens + (now - self.tokens_ts) * self.params.rate_per_second)
        self.tokens_ts = now
        if self.tokens < 1.0:
            return None
        due = self._due(now)
        if due is not None:
            self.tokens -= 1.0
            self.last[due[0]] = now
            self.bad.pop(due[0], None)
            if due[1] == "start":
                self.never.remove(due[0])
        return due

    def _due(self, now: float) -> tuple[str, str] | None:
        if self.never:
            return self.never[0], "start"
        gap = self.params.pair_interval_seconds
        for peer in sorted(self.bad, key=self.bad.__getitem__):
            if now - self.last.get(peer, float("-inf")) >= gap:
                return peer, "bad"
        oldest = min(self.last, key=self.last.__getitem__, default=None)
        if oldest is not None and now - self.last[oldest] >= self.params.refresh_seconds:
            return oldest, "refresh"
        return None


def trace_payload(shape: Shape) -> Callable[[int], bytes]:
    """A probe request of the trace session, TTL as its sequence number: the peer's responder
    echoes it like any probe (so the trace ends at the destination) and the prober ignores it."""
    return lambda ttl: encode(Probe(REQUEST, TRACE_SESSION, ttl, 0, 0, shape))


def is_trace_echo(data: bytes, _ttl: int) -> bool:
    probe = decode(data)
    return probe is not None and probe.kind == REPLY and probe.session == TRACE_SESSION


class PathTracer:
    """Runs the due traces of one prober, one at a time, on the prober's event loop."""

    def __init__(
        self,
        targets: Sequence[Target],
        src_port: int,
        policy: TracePolicy,
        sockets: SocketFactory,
        passer: Passer,
        shape: Shape = Shape.UDP,
        dscp: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.targets = {t.name: t for t in targets}
        self.src_port, self.policy, self.sockets, self.passer = src_port, policy, sockets, passer
        self.shape, self.dscp, self.clock = shape, dscp, clock
        self.results: list[TracedPath] = []

    def take(self) -> list[TracedPath]:
        """The traces finished since the last call."""
        out, self.results = self.results, []
        return out

    async def run(self) -> None:
        while True:
            due = self.policy.next_due(self.clock())
            if due is None:
                await asyncio.sleep(IDLE_SECONDS)
                continue
            try:
                self.results.append(await self.trace(self.targets[due[0]], due[1]))
            except OSError as exc:  # a peer with no route, a source address gone: its pair only
                log.warning("path trace to %s failed: %s", due[0], exc)
            except Exception:  # a bug in one trace must not end tracing (nor the probing beside it)
                log.exception("path trace to %s failed", due[0])

    async def trace(self, target: Target, reason: str) -> TracedPath:
        src = self._source_address(target)
        sock = self.sockets(socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((src, self.src_port))
            sock.connect((target.address, target.port))
            set_dscp(sock, self.dscp)
            p = self.policy.params
            hops = await trace_async(
                sock,
                (target.address, target.port),
                max_hops=p.max_hops,
                timeout_s=p.timeout_seconds,
                attempts=p.attempts,
                payload=trace_payload(self.shape),
                answer=is_trace_echo,
                passer=self.passer,
            )
        finally:
            sock.close()
        return TracedPath(target.name, src, self.src_port, target.address, target.port, tuple(hops), reason)

    def _source_address(self, target: Target) -> str:
        """The address the kernel sends the prober's packets to this peer from (its route's)."""
        with self.sockets(socket.AF_INET) as probe:
            probe.connect((target.address, target.port))
            return str(probe.getsockname()[0])
