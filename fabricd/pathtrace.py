"""Where a probe goes: a UDP traceroute that uses the probe's own 5-tuple (issue 16 §4).

ECMP switches pick a path by hashing the flow's 5-tuple (Linux: ``fib_multipath_hash_policy=1``);
a traceroute with other ports may take another path. ``trace`` sends from a socket bound to the
probe's source address and port, to the probe's destination address and port, with TTL 1, 2, ...,
so every packet hashes like the probe. The routers' ICMP time-exceeded errors come back on that
socket's error queue (``IP_RECVERR``: no raw socket, no privilege), with the router's address;
the destination answers port-unreachable (or the probe's responder replies), which ends the trace.

Each probe carries its TTL in its payload, and an error is matched to the probe by the payload the
ICMP message quotes, so a late answer is never taken for the next hop's.

``hop_elements`` maps hop addresses to topology elements (a switch or host that owns the address)
and ``route_links`` turns the hop sequence into the link ids the localizer's ``routes`` take.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fabricd.topology import Topology

IP_RECVERR = 11  # linux/in.h: Python's socket module does not name it
SO_EE_ORIGIN_ICMP = 2  # linux/errqueue.h
ICMP_DEST_UNREACH, ICMP_TIME_EXCEEDED = 3, 11
_EXTENDED_ERR = struct.Struct("=IBBBBII")  # struct sock_extended_err
_SOCKADDR_IN = struct.Struct("=HH4s")  # the offender, right after it (SO_EE_OFFENDER)
PAYLOAD_PREFIX = b"fabricd-trace ttl="
DEFAULT_TTL = 64


@dataclass(frozen=True, slots=True)
class Hop:
    ttl: int
    address: str | None  # None: no answer within the timeout
    reached: bool = False  # the destination itself answered
    rtt_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class IcmpError:
    origin: int
    type: int
    code: int
    offender: str | None


def parse_recverr(data: bytes) -> IcmpError | None:
    """The ``IP_RECVERR`` control message: ``sock_extended_err`` then the offender's sockaddr_in."""
    if len(data) < _EXTENDED_ERR.size:
        return None
    _errno, origin, kind, code, _pad, _info, _data = _EXTENDED_ERR.unpack_from(data)
    offender = None
    if len(data) >= _EXTENDED_ERR.size + _SOCKADDR_IN.size:
        family, _port, addr = _SOCKADDR_IN.unpack_from(data, _EXTENDED_ERR.size)
        if family == socket.AF_INET:
            offender = socket.inet_ntoa(addr)
    return IcmpError(origin, kind, code, offender)


Payload = Callable[[int], bytes]  # TTL -> the datagram a trace sends with it
Answer = Callable[[bytes, int], bool]  # (datagram from the destination, TTL) -> is it the trace's echo?
Passer = Callable[[bytes, Any], None]  # (datagram, address): not the trace's, for whoever owns it


def default_payload(ttl: int) -> bytes:
    return PAYLOAD_PREFIX + str(ttl).encode()


def any_answer(_data: bytes, _ttl: int) -> bool:
    return True


def trace(
    sock: socket.socket, dst: tuple[str, int], max_hops: int = 16, timeout_s: float = 1.0, attempts: int = 2
) -> list[Hop]:
    """``trace_async`` for a caller without an event loop (the CLI, tests)."""
    return asyncio.run(trace_async(sock, dst, max_hops=max_hops, timeout_s=timeout_s, attempts=attempts))


async def trace_async(
    sock: socket.socket,
    dst: tuple[str, int],
    *,
    max_hops: int = 16,
    timeout_s: float = 1.0,
    attempts: int = 2,
    payload: Payload = default_payload,
    answer: Answer = any_answer,
    passer: Passer | None = None,
) -> list[Hop]:
    """Hops from ``sock`` (bound to the probe's source address and port) to ``dst``, in TTL order,
    up to the destination or ``max_hops``; a hop that stays silent is asked ``attempts`` times in
    all (routers rate-limit ICMP). The socket's TTL and blocking mode are restored afterwards.

    Runs on the caller's event loop without blocking it (the pingmesh agent traces beside its
    probes): datagrams that are not the trace's echo go to ``passer`` (the prober's replies, when
    the trace socket shares the probe's 5-tuple)."""
    sock.setsockopt(socket.SOL_IP, IP_RECVERR, 1)
    blocking_timeout = sock.gettimeout()
    sock.setblocking(False)
    waiter = _Readable(sock, passer)
    hops: list[Hop] = []
    try:
        for ttl in range(1, max_hops + 1):
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
            for _ in range(max(1, attempts)):
                started = time.monotonic()
                _send(sock, payload(ttl), dst)
                hop = await _answer(sock, waiter, _Asked(ttl, dst[0], payload(ttl), answer), started, timeout_s)
                if hop.address is not None:
                    break
            hops.append(hop)
            if hop.reached:
                break
    finally:
        waiter.close()
        _pass_queued(sock, passer)
        _restore(sock)
        sock.settimeout(blocking_timeout)
    return hops


def _pass_queued(sock: socket.socket, passer: Passer | None) -> None:
    """Hand on what is still queued (the caller closes the socket next: its queue would be lost)."""
    cleared = False
    while passer is not None:
        try:
            data, addr = sock.recvfrom(65535)
        except BlockingIOError:
            return
        except OSError:  # a pending ICMP error, cleared by raising: read on once
            if cleared:
                return
            cleared = True
            continue
        cleared = False
        passer(data, addr)


def _send(sock: socket.socket, data: bytes, dst: tuple[str, int]) -> None:
    try:
        sock.sendto(data, dst)
    except OSError:  # a pending ICMP error (sk_err) fails one send and is cleared: send again
        sock.sendto(data, dst)


def _restore(sock: socket.socket) -> None:
    """Back to a plain probe socket: default TTL, no error queue (with IP_RECVERR on, a later send
    on an unconnected socket would raise the port-unreachable the destination sent the trace)."""
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, DEFAULT_TTL)
    sock.setsockopt(socket.SOL_IP, IP_RECVERR, 0)
    while True:
        try:
            sock.recvmsg(512, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except OSError:  # BlockingIOError: drained
            break
    sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)  # clears a pending error


class _Readable:
    """Wakes a waiter when the socket has a datagram or an error queued (epoll reports EPOLLERR as
    readable, so the loop's reader fires for the ICMP errors on the error queue too).

    Datagrams are read in the reader callback itself: the trace's echo is kept with its arrival
    time, every other datagram goes to ``passer`` at once, in the loop iteration in which the
    prober's own socket would have handed it over. Passed on by the woken trace task instead, each
    reply waited one more loop iteration (tens to hundreds of microseconds on a loaded host) for as
    long as the trace ran, and a pair turning bad is traced at once: its RTT rose while it was
    being looked at."""

    def __init__(self, sock: socket.socket, passer: Passer | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.sock, self.passer = sock, passer
        self.fd = sock.fileno()
        self.event = asyncio.Event()
        self.asked: _Asked | None = None
        self.echoes: deque[float] = deque()  # arrival times of the asked packet's echoes
        self.loop.add_reader(self.fd, self._ready)

    def ask(self, asked: _Asked) -> None:
        """The packet now awaited: echoes of earlier ones are stale."""
        self.asked = asked
        self.echoes.clear()

    def echo(self) -> float | None:
        """When the awaited packet's echo arrived (None: not yet)."""
        self._drain()
        return self.echoes.popleft() if self.echoes else None

    def _ready(self) -> None:
        self._drain()
        self.event.set()

    def _drain(self) -> None:
        cleared = False
        while True:
            try:
                data, addr = self.sock.recvfrom(65535)
            except BlockingIOError:
                return
            except OSError:  # the pending error of an ICMP message, cleared by raising: read on once
                if cleared:
                    return
                cleared = True
                continue
            cleared = False
            asked = self.asked
            if asked is not None and addr[0] == asked.dst_ip and asked.answer(data, asked.ttl):
                self.echoes.append(time.monotonic())
            elif self.passer is not None:
                self.passer(data, addr)

    async def wait(self, timeout_s: float) -> None:
        self.event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout_s)

    def close(self) -> None:
        self.loop.remove_reader(self.fd)


@dataclass(frozen=True, slots=True)
class _Asked:
    ttl: int
    dst_ip: str
    sent: bytes
    answer: Answer


async def _answer(sock: socket.socket, waiter: _Readable, asked: _Asked, started: float, timeout_s: float) -> Hop:
    waiter.ask(asked)
    deadline = started + timeout_s
    while True:
        hop = _take_errors(sock, asked, started)
        if hop is not None:
            return hop
        arrived = waiter.echo()
        if arrived is not None:  # the destination itself answered: the end
            return Hop(asked.ttl, asked.dst_ip, True, arrived - started)
        left = deadline - time.monotonic()
        if left <= 0:
            return Hop(asked.ttl, None)
        await waiter.wait(left)


def _take_errors(sock: socket.socket, asked: _Asked, started: float) -> Hop | None:
    """The ICMP error answering this TTL's packet, from the error queue (others are dropped: another
    packet's late answer, or not an ICMP error)."""
    while True:
        try:
            quoted, ancillary, _flags, _addr = sock.recvmsg(512, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        err = next((parse_recverr(d) for lvl, kind, d in ancillary if (lvl, kind) == (socket.SOL_IP, IP_RECVERR)), None)
        if err is None or err.origin != SO_EE_ORIGIN_ICMP or quoted != asked.sent:
            continue
        rtt = time.monotonic() - started
        if err.type == ICMP_TIME_EXCEEDED:
            return Hop(asked.ttl, err.offender, False, rtt)
        return Hop(asked.ttl, err.offender, err.offender == asked.dst_ip, rtt)  # unreachable: the end


# --- hops -> topology elements -----------------------------------------------------------------


def hop_elements(hops: Sequence[Hop], owner: Mapping[str, str]) -> list[str | None]:
    """Each hop's element: the switch or host that owns its address (None: silent or unknown)."""
    return [owner.get(h.address) if h.address is not None else None for h in hops]


def route_links(topology: Topology, src_hca: str, dst_hca: str, elements: Sequence[str | None]) -> list[str] | None:
    """The link ids a traced path crosses: the source's host link, each link between consecutive
    switches, the destination's host link. None when a hop is unknown or two hops share no link
    (a path the topology cannot explain is no route)."""
    switches = [e for e in elements if e in topology.switches]
    if len(switches) != len([e for e in elements if e != topology.hca_ports[dst_hca].node]):
        return None
    up, down = topology.uplink(src_hca), topology.uplink(dst_hca)
    if up is None or down is None or not switches or switches[0] != up.b or switches[-1] != down.b:
        return None
    links = [up.id]
    for a, b in itertools.pairwise(switches):
        link = topology.link_between(a, b)
        if link is None:
            return None
        links.append(link)
    return [*links, down.id]
