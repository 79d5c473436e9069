"""The SIOCETHTOOL ioctl: the ethtool collector's production source, and the values every source returns.

``ethtool -S``, ``-i`` and link state straight from the kernel (include/uapi/linux/ethtool.h,
include/uapi/linux/sockios.h), never through an ``ethtool`` subprocess (node_exporter bans shelling
out from routine collectors). ``IoctlSource`` keeps every call on one thread of its own, which may
enter a named network namespace first. ``collectors/ethtool.py`` maps what it reads to readings.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import os
import socket
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# iproute2 keeps named network namespaces here (``ip netns add``); a path in ``netns`` overrides it.
IPROUTE2_NETNS_DIR = Path("/run/netns")


@dataclass(frozen=True, slots=True)
class DriverInfo:
    driver: str
    version: str = ""
    firmware_version: str = ""
    bus_info: str = ""


@dataclass(frozen=True, slots=True)
class LinkSettings:
    speed_mbps: int | None = None  # None: unknown (link down reports SPEED_UNKNOWN)
    duplex: str | None = None
    link_detected: bool | None = None


@dataclass(slots=True)
class InterfaceStats:
    """What a source read for one interface; ``error`` set when the driver refused."""

    ifname: str
    stats: dict[str, int] = field(default_factory=dict)
    driver: DriverInfo | None = None
    link: LinkSettings | None = None
    error: str = ""


Select = Callable[[str], bool]


# ---------------------------------------------------------------------------------------------
# SIOCETHTOOL ioctl (include/uapi/linux/ethtool.h, include/uapi/linux/sockios.h)
# ---------------------------------------------------------------------------------------------

SIOCETHTOOL = 0x8946
SIOCGIFFLAGS = 0x8913
IFF_LOOPBACK = 0x8
ETHTOOL_GSET = 0x01
ETHTOOL_GDRVINFO = 0x03
ETHTOOL_GLINK = 0x0A
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSTATS = 0x1D
ETHTOOL_GSSET_INFO = 0x37
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16
SIZEOF_IFREQ = 40
CLONE_NEWNET = 0x40000000
# The kernel writes as many u64 values as the driver has *now* (net/ethtool/ioctl.c,
# ethtool_get_stats), which may exceed the count read a moment before: leave room for growth.
STATS_SLACK = 256
_NOT_SUPPORTED = {errno.EOPNOTSUPP, errno.ENODEV, errno.EINVAL}


def _cstr(raw: bytes) -> str:
    # rstrip: cxgb4 pads its statistics names with blanks (kernel commit 0bf9a7d6174f, v4.5)
    return raw.split(b"\0", 1)[0].decode(errors="replace").rstrip()


class EthtoolIoctl:
    """Blocking SIOCETHTOOL calls on one socket (the socket's netns decides which interfaces)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def _call(self, request: int, ifname: str, payload: ctypes.Array[ctypes.c_char]) -> None:
        # struct ifreq: ifr_name[IFNAMSIZ] then a union whose ifr_data points at the ethtool struct.
        ifreq = struct.pack(f"{IFNAMSIZ}sP", ifname.encode(), ctypes.addressof(payload))
        fcntl.ioctl(self._sock.fileno(), request, ifreq.ljust(SIZEOF_IFREQ, b"\0"))

    def is_loopback(self, ifname: str) -> bool:
        ifreq = struct.pack(f"{IFNAMSIZ}sH", ifname.encode(), 0).ljust(SIZEOF_IFREQ, b"\0")
        result = fcntl.ioctl(self._sock.fileno(), SIOCGIFFLAGS, ifreq)
        (flags,) = struct.unpack_from("H", result, IFNAMSIZ)
        return bool(flags & IFF_LOOPBACK)

    def n_stats(self, ifname: str) -> int:
        # struct ethtool_sset_info { u32 cmd; u32 reserved; u64 sset_mask; u32 data[]; }
        buf = ctypes.create_string_buffer(24)
        struct.pack_into("IIQ", buf, 0, ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS)
        self._call(SIOCETHTOOL, ifname, buf)
        _, _, mask, count = struct.unpack_from("IIQI", buf, 0)
        if not mask & (1 << ETH_SS_STATS):
            raise OSError(errno.EOPNOTSUPP, "driver has no ETH_SS_STATS string set")
        return int(count)

    def strings(self, ifname: str, count: int) -> list[str]:
        # struct ethtool_gstrings { u32 cmd; u32 string_set; u32 len; u8 data[len * 32]; }
        buf = ctypes.create_string_buffer(12 + (count + STATS_SLACK) * ETH_GSTRING_LEN)
        struct.pack_into("III", buf, 0, ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
        self._call(SIOCETHTOOL, ifname, buf)
        (got,) = struct.unpack_from("I", buf, 8)
        raw = buf.raw[12 : 12 + got * ETH_GSTRING_LEN]
        return [_cstr(raw[i : i + ETH_GSTRING_LEN]) for i in range(0, len(raw), ETH_GSTRING_LEN)]

    def stats(self, ifname: str, count: int) -> list[int]:
        # struct ethtool_stats { u32 cmd; u32 n_stats; u64 data[n_stats]; }
        buf = ctypes.create_string_buffer(8 + (count + STATS_SLACK) * 8)
        struct.pack_into("II", buf, 0, ETHTOOL_GSTATS, count)
        self._call(SIOCETHTOOL, ifname, buf)
        (got,) = struct.unpack_from("I", buf, 4)
        return list(struct.unpack_from(f"{got}Q", buf, 8))

    def driver(self, ifname: str) -> DriverInfo:
        # struct ethtool_drvinfo { u32 cmd; char driver[32], version[32], fw_version[32],
        # bus_info[32], erom_version[32], reserved2[12]; u32 n_priv_flags, n_stats, ...; }
        buf = ctypes.create_string_buffer(196)
        struct.pack_into("I", buf, 0, ETHTOOL_GDRVINFO)
        self._call(SIOCETHTOOL, ifname, buf)
        fields = [_cstr(buf.raw[4 + 32 * i : 36 + 32 * i]) for i in range(4)]
        return DriverInfo(*fields)

    def link(self, ifname: str) -> LinkSettings:
        return LinkSettings(self._speed(ifname), None, self._link_detected(ifname))

    def _speed(self, ifname: str) -> int | None:
        # struct ethtool_cmd (legacy GSET, still answered through get_link_ksettings):
        # speed is u16 at offset 12, speed_hi u16 at offset 28; 0xFFFFFFFF = SPEED_UNKNOWN.
        buf = ctypes.create_string_buffer(44)
        struct.pack_into("I", buf, 0, ETHTOOL_GSET)
        try:
            self._call(SIOCETHTOOL, ifname, buf)
        except OSError:
            return None
        (low,) = struct.unpack_from("H", buf, 12)
        (high,) = struct.unpack_from("H", buf, 28)
        speed = (high << 16) | low
        return None if speed in (0, 0xFFFFFFFF) else speed

    def _link_detected(self, ifname: str) -> bool | None:
        buf = ctypes.create_string_buffer(8)  # struct ethtool_value { u32 cmd; u32 data; }
        struct.pack_into("I", buf, 0, ETHTOOL_GLINK)
        try:
            self._call(SIOCETHTOOL, ifname, buf)
        except OSError:
            return None
        return bool(struct.unpack_from("I", buf, 4)[0])


def _enter_netns(path: Path) -> None:
    """Move the calling thread (only) into the network namespace at ``path`` (setns(2))."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def netns_path(netns: str) -> Path:
    return Path(netns) if "/" in netns else IPROUTE2_NETNS_DIR / netns


class IoctlSource:
    """The kernel through SIOCETHTOOL, optionally inside a named network namespace.

    All calls run on one dedicated worker thread; with ``netns`` that thread enters the namespace
    once (setns affects only the calling thread), so the socket, ``if_nameindex`` and every ioctl
    see that namespace's interfaces. The string table is cached per interface and re-fetched when
    the driver's statistic count changes.
    """

    def __init__(self, netns: str | None = None) -> None:
        self._netns = netns
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ethtool")
        self._ioctl: EthtoolIoctl | None = None
        self._names: dict[str, list[str]] = {}

    async def read(self, select: Select) -> list[InterfaceStats]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._read_all, select)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        if self._ioctl is not None:
            self._ioctl._sock.close()

    def _open(self) -> EthtoolIoctl:
        if self._ioctl is None:
            if self._netns is not None:
                _enter_netns(netns_path(self._netns))
            self._ioctl = EthtoolIoctl(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        return self._ioctl

    def _read_all(self, select: Select) -> list[InterfaceStats]:
        ioctl = self._open()
        out = []
        for _, ifname in sorted(socket.if_nameindex()):
            if not select(ifname):
                continue
            snap = self._read_one(ioctl, ifname)
            if snap is not None:
                out.append(snap)
        return sorted(out, key=lambda s: s.ifname)

    def _read_one(self, ioctl: EthtoolIoctl, ifname: str) -> InterfaceStats | None:
        try:
            if ioctl.is_loopback(ifname):
                return None
            values = self._values(ioctl, ifname)
            return InterfaceStats(ifname, values, ioctl.driver(ifname), ioctl.link(ifname))
        except OSError as exc:
            if exc.errno in _NOT_SUPPORTED:
                return None  # no ethtool statistics on this device (bridge, tunnel, ...)
            return InterfaceStats(ifname, error=f"{exc.strerror or exc}")

    def _values(self, ioctl: EthtoolIoctl, ifname: str) -> dict[str, int]:
        count = ioctl.n_stats(ifname)
        names = self._names.get(ifname)
        if names is None or len(names) != count:
            names = self._names[ifname] = ioctl.strings(ifname, count)
        values = ioctl.stats(ifname, count)
        if len(values) != len(names):  # the driver changed its table between the two calls
            self._names.pop(ifname, None)
            raise OSError(errno.EAGAIN, "statistics table changed during read")
        return _first_wins(names, values)


def _first_wins(names: Sequence[str], values: Sequence[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, value in zip(names, values, strict=True):
        out.setdefault(name, value)
    return out
