"""A UDP endpoint whose datagrams carry the time the kernel received them (``SO_TIMESTAMPNS``).

A prober's event loop can stall: a busy GPU host's data loaders, an agent's own start-up, a loaded
CI machine. Read when the loop comes back, a reply that arrived in time looks as late as the stall,
and past the probe timeout it is counted lost: one measured start of two demos on two cores lost
the first 4-11 probes of every pair of the agents that started first (every one of 24 pairs, none
through a faulty element), and a ``packet_loss`` incident opened on a healthy leaf a minute later.
The kernel stamps each datagram as it arrives (``ping -D`` and OWAMP read the same stamp), so the
prober can tell a reply that arrived in time from one that did not, whenever it reads it
(``fabricd.probe_ledger.Ledger.on_reply`` decides what the stamp is used for). Where the option is
missing (not Linux), the read time stands in for it, as before.

The endpoint reads with ``loop.add_reader`` and ``recvmsg`` (asyncio's datagram transport reads with
``recvfrom`` and drops ancillary data): one datagram per readiness, as asyncio's transport reads, so
the read times the RTTs are taken from stay what they were; ``drain`` reads all that is queued (a
scrape, before it expires probes). It sends with ``sendto``, and says whether the datagram went: one
that cannot be sent at once (a full socket buffer) is the host's drop, not the network's.

A stall long enough fills the socket's receive queue, and the kernel drops what arrives next: the
prober would count those replies lost, the fabric's loss, though its own host dropped them. On a
CI machine with both cores busy one lab prober lost probes to every peer at once, its own leaf's
among them, and a ``packet_loss`` incident opened on a healthy link (tests/test_leafspine_lab.py,
2026-12-07). The kernel counts each socket's drops (``sk_drops``) and hands the count over with
each datagram queued after them (``SO_RXQ_OVFL``, socket(7)); ``SO_MEMINFO``'s ``SK_MEMINFO_DROPS``
reads it at any time (include/uapi/linux/sock_diag.h), for the drops after the last datagram
queued. The endpoint tells ``dropped`` how many more the socket dropped before it hands on the
datagram read next, and after a ``drain``. ``receive_buffer`` sizes the queue so that it takes a
long stall's datagrams in the first place.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

# Linux: SO_TIMESTAMPNS (SO_TIMESTAMPNS_OLD in include/uapi/asm-generic/socket.h; a struct timespec
# of two native longs, 16 bytes on 64-bit). The cmsg type equals the option (SCM_TIMESTAMPNS).
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@qq")
# Linux, include/uapi/asm-generic/socket.h: the drop count's cmsg (a __u32, wrapping), the force
# variant of SO_RCVBUF (CAP_NET_ADMIN: past net.core.rmem_max), and the socket's memory counters
# (an array of __u32, SK_MEMINFO_DROPS the ninth, since Linux 4.6; sock_diag.h).
SO_RXQ_OVFL = 40
SO_RCVBUFFORCE = 33
SO_MEMINFO = 55
SK_MEMINFO_DROPS = 8
_U32 = struct.Struct("@I")
_ANC_BYTES = socket.CMSG_SPACE(_TIMESPEC.size) + socket.CMSG_SPACE(_U32.size)
DRAIN_MAX = 4096  # datagrams one ``drain`` reads at most (a socket buffer's worth of replies)
MAX_DATAGRAM = 65535

# (data, address, arrival time on the endpoint's clock in ns)
Receiver = Callable[[bytes, Any, int], None]
Dropped = Callable[[int], None]  # how many more datagrams the socket dropped


def _no_drops(_count: int) -> None:
    pass


class StampedEndpoint:
    """Reads ``sock`` as datagrams arrive, handing each to ``receive`` with its kernel arrival time
    on ``clock_ns``'s clock; ``error`` gets what a read raises (an ICMP port unreachable), ``dropped``
    how many datagrams the socket dropped since it last heard, before the datagram read after them."""

    def __init__(
        self,
        sock: socket.socket,
        receive: Receiver,
        error: Callable[[Exception], None],
        clock_ns: Callable[[], int],
        dropped: Dropped = _no_drops,
    ) -> None:
        self.sock, self.receive, self.error, self.clock_ns, self.dropped = sock, receive, error, clock_ns, dropped
        self.stamped = _enable(sock)
        self.drops = socket_drops(sock) or 0  # the socket's drop count as last seen (wraps at 2**32)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.sock.setblocking(False)
        self._loop = loop
        loop.add_reader(self.sock.fileno(), self.read_ready)

    def read_ready(self) -> None:
        """Read one datagram (the loop calls again while more are queued)."""
        self._read_one()

    def drain(self) -> None:
        """Read every datagram queued now (at most ``DRAIN_MAX``), then learn of the drops after the
        last one queued (no datagram carries their count yet)."""
        for _ in range(DRAIN_MAX):
            if not self._read_one():
                break
        if not self.is_closing() and (now := socket_drops(self.sock)) is not None:
            self._learn(now)

    def _learn(self, count: int) -> None:
        """The socket's drop count is ``count`` now: tell ``dropped`` of the rise."""
        rise = (count - self.drops) & 0xFFFFFFFF
        if rise and rise < 0x80000000:  # an older count read late is not a rise of 2**32 less a few
            self.drops = count
            self.dropped(rise)

    def _read_one(self) -> bool:
        """Hand on one datagram; False when none was queued (or the socket is closed)."""
        if self.sock.fileno() < 0:
            return False
        try:
            data, anc, _flags, addr = self.sock.recvmsg(MAX_DATAGRAM, _ANC_BYTES)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:  # an ICMP error queued on the socket: reported, and the next read goes on
            self.error(exc)
            return True
        for level, kind, value in anc:
            if level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(value) >= _U32.size:
                self._learn(_U32.unpack_from(value)[0])
        self.receive(data, addr, self._arrival(anc))
        return True

    def _arrival(self, anc: list[tuple[int, int, bytes]]) -> int:
        """The kernel's receive time moved onto ``clock_ns``'s clock (now, less the datagram's age
        by the wall clock: the two clocks' offset is read now, so no drift enters)."""
        now = self.clock_ns()
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(data)
                return now - max(0, time.time_ns() - (sec * 1_000_000_000 + nsec))
        return now

    def sendto(self, data: bytes, addr: Any) -> bool:
        """Send one datagram; False when it did not go (a full send buffer, an error reported)."""
        try:
            self.sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            return False  # the host's own drop: the caller does not count it as the network's
        except OSError as exc:
            self.error(exc)
            return False
        return True

    def is_closing(self) -> bool:
        return self.sock.fileno() < 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``socket`` and ``sockname``, as asyncio transports answer them."""
        if self.is_closing():
            return default
        return {"socket": self.sock, "sockname": self.sock.getsockname()}.get(name, default)

    def close(self) -> None:
        if self.is_closing():
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.sock.fileno())
        self.sock.close()


def _enable(sock: socket.socket) -> bool:
    """Ask the kernel to stamp received datagrams, and to hand over its drop count with them;
    False where it cannot stamp (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    with contextlib.suppress(OSError):  # without it, drain's read of the count still tells
        sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
    return True


def socket_drops(sock: socket.socket) -> int | None:
    """The datagrams ``sock`` has dropped (``SK_MEMINFO_DROPS``); None where the kernel does not
    say (not Linux, before 4.6, a closed socket)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, _U32.size * (SK_MEMINFO_DROPS + 1))
    except OSError:
        return None
    if len(raw) < _U32.size * (SK_MEMINFO_DROPS + 1):
        return None
    return int(_U32.unpack_from(raw, _U32.size * SK_MEMINFO_DROPS)[0])


def receive_buffer(sock: socket.socket, nbytes: int) -> int:
    """Ask for a receive queue of ``nbytes`` (of the kernel's accounting, which charges each
    datagram its buffer's whole size: about 1 KiB for a probe on loopback or a veth, measured in
    tests/test_udpstamp.py), past ``net.core.rmem_max`` where the process may (``SO_RCVBUFFORCE``,
    CAP_NET_ADMIN; an agent reading the ethtool ioctl has it); returns the size the kernel set
    (twice the request: socket(7))."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, nbytes)
    except OSError:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, nbytes)
    return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
