"""Path tracing beside the pingmesh probes (issue 16 §4): which pair to trace when, and the trace.

Each probed pair is traced with the probe's own 5-tuple (``fabricd.pathtrace``), so ECMP hashes
the trace down the probe's path: a socket bound to the prober's source address and port
(``SO_REUSEPORT``: the prober's socket keeps both) and connected to the peer's responder. Linux
delivers a datagram to the connected socket before the wildcard one, so while the trace runs the
peer's ICMP errors and replies reach it; replies to the prober's own probes are handed back to the
prober at once (same event loop: their RTT is not delayed), the others are the trace's.

The reply's path too: a probe's RTT and loss are the round trip, and an ECMP fabric hashes the
reply's 5-tuple (responder address and port -> prober address and port) on its own. The responder
side traces it with that 5-tuple: a socket bound to the responder's address and port
(``SO_REUSEPORT`` beside the responder's), connected to the prober's address and source port; the
prober echoes the trace's last packet (``fabricd.probe.TRACE_SESSION``), and the prober's own
probes that reach the trace socket meanwhile are answered by the responder at once. Each prober
heard is a pair to trace (key ``reply <address>:<port>``), on the same policy and budget.

When (``TracePolicy``, pure: times passed in):

- *start*: every pair once, when probing starts;
- *bad*: a pair whose probes were lost, or whose RTT p99 jumped, in a scrape interval (a fault on
  its path, or a re-route onto another link), at most once per ``pair_interval_seconds``;
- *refresh*: every ``refresh_seconds`` (a re-route on a Clos keeps the path's length, so neither
  the hop count nor the reply TTL would show it: only a new trace does), give or take
  ``REFRESH_SPREAD`` of it at random per trace: agents started together (a rollout, the demo)
  would otherwise all refresh in the same second, every time.

A token bucket (``rate_per_second``, ``BURST``) bounds traces per agent, so a storm of bad pairs
never floods the switches' control planes with TTL-expired packets (their ICMP generation is rate
limited, and a silenced hop would read as a silent one); traces run one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fabricd.pathtrace import Hop, Passer, trace_async
from fabricd.probe import REPLY, REQUEST, TRACE_SESSION, Probe, Shape, SocketFactory, Target, decode, encode, set_dscp

log = logging.getLogger(__name__)
REPLY_KEY = "reply "  # a policy key for the path of our replies to one prober: "reply <address>:<port>"
PROBER_STALE_SECONDS = 120.0  # a prober not heard from this long is no longer traced
BURST = 5  # traces the bucket lets through at once (a new agent's first pairs)
IDLE_SECONDS = 1.0  # how often the runner looks for due traces when none is due
REFRESH_SPREAD = 0.1  # each refresh comes due after refresh_seconds +/- this share of it


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
    direction: str = "request"  # or "reply": our replies' path to a prober (``peer``), from here


class TracePolicy:
    """Which peer to trace next, and why (pure)."""

    def __init__(self, params: TraceParams, peers: Sequence[str], now: float, rng: random.Random | None = None) -> None:
        self.params, self.rng = params, rng  # no rng: every refresh after exactly refresh_seconds
        self.never = list(peers)  # traced at start, in peer order
        self.last: dict[str, float] = {}  # peer -> when its last trace started
        self.refresh_at: dict[str, float] = {}  # peer -> when its next refresh is due
        self.bad: dict[str, float] = {}  # peer -> when it turned bad (not traced since)
        self.tokens, self.tokens_ts = float(BURST), now

    def mark_bad(self, peer: str, now: float) -> None:
        self.bad.setdefault(peer, now)

    def add(self, key: str) -> None:
        """A new pair to trace (a prober first heard): traced like a pair at start."""
        if key not in self.last and key not in self.never:
            self.never.append(key)

    def forget(self, key: str) -> None:
        with contextlib.suppress(ValueError):
            self.never.remove(key)
        self.last.pop(key, None)
        self.refresh_at.pop(key, None)
        self.bad.pop(key, None)

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
            self.refresh_at[due[0]] = now + self._refresh_period()
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
        first = min(self.refresh_at, key=self.refresh_at.__getitem__, default=None)
        if first is not None and now >= self.refresh_at[first]:
            return first, "refresh"
        return None

    def _refresh_period(self) -> float:
        if self.rng is None:
            return self.params.refresh_seconds
        return self.params.refresh_seconds * (1.0 + REFRESH_SPREAD * (2.0 * self.rng.random() - 1.0))


def trace_payload(shape: Shape) -> Callable[[int], bytes]:
    """A probe request of the trace session, TTL as its sequence number: the peer's responder
    echoes it like any probe (so the trace ends at the destination) and the prober ignores it."""
    return lambda ttl: encode(Probe(REQUEST, TRACE_SESSION, ttl, 0, 0, shape))


def is_trace_echo(data: bytes, _ttl: int) -> bool:
    probe = decode(data)
    return probe is not None and probe.kind == REPLY and probe.session == TRACE_SESSION


@dataclass(frozen=True, slots=True)
class Replies:
    """Where this agent answers probes: its responder's port, and who takes the probes that reach a
    reply trace's socket (the responder)."""

    port: int
    passer: Passer


def reply_key(address: str, port: int) -> str:
    return f"{REPLY_KEY}{address}:{port}"


class PathTracer:
    """Runs the due traces of one agent (its probes' paths, and its replies' to each prober), one
    at a time, on the agent's event loop."""

    def __init__(
        self,
        targets: Sequence[Target],
        src_port: int | None,
        policy: TracePolicy,
        sockets: SocketFactory,
        passer: Passer,
        shape: Shape = Shape.UDP,
        dscp: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        replies: Replies | None = None,
    ) -> None:
        self.targets = {t.name: t for t in targets}
        self.names = {t.address: t.name for t in targets}
        self.src_port, self.policy, self.sockets, self.passer = src_port, policy, sockets, passer
        self.shape, self.dscp, self.clock, self.replies = shape, dscp, clock, replies
        self.results: list[TracedPath] = []
        self._probers: dict[str, tuple[str, int]] = {}  # policy key -> the prober's (address, port)

    def learn(self, probers: Mapping[tuple[str, int], float], now: float) -> None:
        """The probers the responder heard (``now`` on their clock): new ones are traced, the
        silent forgotten (a restarted prober's old source port)."""
        if self.replies is None:
            return
        for (address, port), heard in probers.items():
            key = reply_key(address, port)
            if now - heard <= PROBER_STALE_SECONDS and key not in self._probers:
                self._probers[key] = (address, port)
                self.policy.add(key)
        for key, prober in list(self._probers.items()):
            if now - probers.get(prober, float("-inf")) > PROBER_STALE_SECONDS:
                del self._probers[key]
                self.policy.forget(key)

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
                prober = self._probers.get(due[0])
                if prober is not None:
                    self.results.append(await self.trace_reply(*prober, due[1]))
                elif due[0] in self.targets:
                    self.results.append(await self.trace(self.targets[due[0]], due[1]))
            except OSError as exc:  # a peer with no route, a source address gone: its pair only
                log.warning("path trace to %s failed: %s", due[0], exc)
            except Exception:  # a bug in one trace must not end tracing (nor the probing beside it)
                log.exception("path trace to %s failed", due[0])

    async def trace(self, target: Target, reason: str) -> TracedPath:
        """The path of our probes to ``target``, with their 5-tuple."""
        assert self.src_port is not None
        src, hops = await self._trace(self.src_port, (target.address, target.port), self.passer)
        return TracedPath(target.name, src, self.src_port, target.address, target.port, hops, reason)

    async def trace_reply(self, address: str, port: int, reason: str) -> TracedPath:
        """The path of our replies to the prober at ``address``:``port``, with their 5-tuple."""
        assert self.replies is not None
        src, hops = await self._trace(self.replies.port, (address, port), self.replies.passer)
        peer = self.names.get(address, address)
        return TracedPath(peer, src, self.replies.port, address, port, hops, reason, direction="reply")

    async def _trace(self, src_port: int, dst: tuple[str, int], passer: Passer) -> tuple[str, tuple[Hop, ...]]:
        src = self._source_address(dst)
        sock = self.sockets(socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((src, src_port))
            sock.connect(dst)
            set_dscp(sock, self.dscp)
            p = self.policy.params
            hops = await trace_async(
                sock,
                dst,
                max_hops=p.max_hops,
                timeout_s=p.timeout_seconds,
                attempts=p.attempts,
                payload=trace_payload(self.shape),
                answer=is_trace_echo,
                passer=passer,
            )
        finally:
            sock.close()
        return src, tuple(hops)

    def _source_address(self, dst: tuple[str, int]) -> str:
        """The address the kernel sends our packets to ``dst`` from (its route's)."""
        with self.sockets(socket.AF_INET) as probe:
            probe.connect(dst)
            return str(probe.getsockname()[0])
