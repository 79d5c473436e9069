"""A UDP endpoint whose datagrams carry the time the kernel received them (``SO_TIMESTAMPNS``).

A prober's event loop can stall: a busy GPU host's data loaders, an agent's own start-up, a loaded
CI machine. Read when the loop comes back, a reply that arrived in time looks as late as the stall,
and past the probe timeout it is counted lost: one measured start of two demos on two cores lost
the first 4-11 probes of every pair of the agents that started first (every one of 24 pairs, none
through a faulty element), and a ``packet_loss`` incident opened on a healthy leaf a minute later.
The kernel stamps each datagram as it arrives (``ping -D`` and OWAMP read the same stamp), so the
prober can tell a reply that arrived in time from one that did not, whenever it reads it
(``fabricd.probe.Ledger.on_reply`` decides what the stamp is used for). Where the option is
missing (not Linux), the read time stands in for it, as before.

The endpoint reads with ``loop.add_reader`` and ``recvmsg`` (asyncio's datagram transport reads with
``recvfrom`` and drops ancillary data): one datagram per readiness, as asyncio's transport reads, so
the read times the RTTs are taken from stay what they were; ``drain`` reads all that is queued (a
scrape, before it expires probes). It sends with ``sendto``: a probe that cannot be sent at once (a
full socket buffer) is dropped, and its timeout counts it lost, as the network would.
"""

from __future__ import annotations

import asyncio
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
_ANC_BYTES = socket.CMSG_SPACE(_TIMESPEC.size)
DRAIN_MAX = 4096  # datagrams one ``drain`` reads at most (a socket buffer's worth of replies)
MAX_DATAGRAM = 65535

# (data, address, arrival time on the endpoint's clock in ns)
Receiver = Callable[[bytes, Any, int], None]


class StampedEndpoint:
    """Reads ``sock`` as datagrams arrive, handing each to ``receive`` with its kernel arrival time
    on ``clock_ns``'s clock; ``error`` gets what a read raises (an ICMP port unreachable)."""

    def __init__(
        self, sock: socket.socket, receive: Receiver, error: Callable[[Exception], None], clock_ns: Callable[[], int]
    ) -> None:
        self.sock, self.receive, self.error, self.clock_ns = sock, receive, error, clock_ns
        self.stamped = _enable(sock)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.sock.setblocking(False)
        self._loop = loop
        loop.add_reader(self.sock.fileno(), self.read_ready)

    def read_ready(self) -> None:
        """Read one datagram (the loop calls again while more are queued)."""
        self._read_one()

    def drain(self) -> None:
        """Read every datagram queued now (at most ``DRAIN_MAX``)."""
        for _ in range(DRAIN_MAX):
            if not self._read_one():
                return

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

    def sendto(self, data: bytes, addr: Any) -> None:
        try:
            self.sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            pass  # a full send buffer drops the probe; its timeout counts it lost
        except OSError as exc:
            self.error(exc)

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
    """Ask the kernel to stamp received datagrams; False where it cannot (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True
