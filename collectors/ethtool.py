"""NIC statistics (``ethtool -S``) through the SIOCETHTOOL ioctl, mapped to vendor-neutral names.

The side effect sits behind ``EthtoolSource`` (one method): the default reads the kernel through
the ioctl (never an ``ethtool`` subprocess: node_exporter bans shelling out from routine collectors);
``FileSource`` reads captured ``ethtool -S`` text, which tests and the simulator feed. Parsing of that
text is pure (``parse_ethtool_s``, ``parse_ethtool_i``, ``parse_ethtool_settings``).

Cardinality is bounded on purpose (ethtool made 57% of one host's series in a peer exporter): only
statistics with a neutral name (``fabricd.ethtool_names``) are emitted unless ``include_unmapped`` is
on, and per-queue statistics only with ``include_queues``.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import logging
import os
import re
import socket
import struct
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import ClassVar, Protocol

from pydantic import field_validator

from fabricd.collector import CollectorContext, CollectorFactories, CollectorOptions
from fabricd.ethtool_names import is_queue_stat, neutral
from fabricd.model import Kind, Labels, Reading, labels_of

log = logging.getLogger(__name__)

SOURCE = "ethtool"
# iproute2 keeps named network namespaces here (``ip netns add``); a path in ``netns`` overrides it.
IPROUTE2_NETNS_DIR = Path("/run/netns")


# ---------------------------------------------------------------------------------------------
# Pure parsers for captured ethtool text
# ---------------------------------------------------------------------------------------------


class EthtoolReadError(Exception):
    """The driver refused the request (``ERROR: 1`` in a capture, an errno from the ioctl)."""


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


_ERROR = re.compile(r"ERROR:\s*(\d+)\s*")
_STAT_LINE = re.compile(r"\s*(?P<name>\S.*?):\s+(?P<value>\d+)\s*")


def parse_ethtool_s(text: str) -> dict[str, int]:
    """``ethtool -S`` text -> {raw statistic name: value}.

    Accepts the shapes found in real captures: with or without the ``NIC statistics:`` header and
    indentation, a leading ``# ethtool -S eth0`` comment, names with spaces or dots
    (``duplicate metric``, ``port.rx_dropped``), and stray ``netlink error:`` lines. A capture that
    is only ``ERROR: <errno>`` (no newline) raises ``EthtoolReadError``. Raw names are kept exactly;
    the first occurrence of a repeated name wins.
    """
    error = _ERROR.fullmatch(text)
    if error:
        raise EthtoolReadError(f"driver returned error {error.group(1)}")
    stats: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = _STAT_LINE.fullmatch(line)
        if match:
            stats.setdefault(match["name"], int(match["value"]))
    return stats


def _key_values(text: str) -> dict[str, str]:
    """``key: value`` lines of ``ethtool`` / ``ethtool -i`` output, keys lower-cased."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("#") or ":" not in line:
            continue
        key, _, value = line.strip().partition(":")
        out.setdefault(key.strip().lower(), value.strip())
    return out


def parse_ethtool_i(text: str) -> DriverInfo:
    """``ethtool -i`` (driver information) text."""
    kv = _key_values(text)
    if "driver" not in kv:
        raise EthtoolReadError("no 'driver:' line in ethtool -i output")
    return DriverInfo(kv["driver"], kv.get("version", ""), kv.get("firmware-version", ""), kv.get("bus-info", ""))


def parse_ethtool_settings(text: str) -> LinkSettings:
    """``ethtool <if>`` (link settings) text; embedded ``netlink error:`` lines are ignored."""
    kv = _key_values(text)
    speed = re.fullmatch(r"(\d+)Mb/s", kv.get("speed", ""))
    link = kv.get("link detected")
    return LinkSettings(
        speed_mbps=int(speed.group(1)) if speed else None,
        duplex=kv.get("duplex", "").lower() or None,
        link_detected=None if link is None else link == "yes",
    )


# ---------------------------------------------------------------------------------------------
# The source seam
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class InterfaceStats:
    """What a source read for one interface; ``error`` set when the driver refused."""

    ifname: str
    stats: dict[str, int] = field(default_factory=dict)
    driver: DriverInfo | None = None
    link: LinkSettings | None = None
    error: str = ""


Select = Callable[[str], bool]


class EthtoolSource(Protocol):
    async def read(self, select: Select) -> list[InterfaceStats]:
        """Statistics of every non-loopback interface whose name ``select`` accepts."""
        ...


class FileSource:
    """Captured text under ``stats_dir``: node_exporter's fixture layout ``<if>/statistics`` (with
    optional ``<if>/driver`` = ``ethtool -i`` and ``<if>/settings`` = ``ethtool <if>``), or a flat
    ``<if>.txt`` holding ``ethtool -S`` output."""

    def __init__(self, stats_dir: Path) -> None:
        self._dir = stats_dir

    async def read(self, select: Select) -> list[InterfaceStats]:
        return await asyncio.to_thread(self._read_all, select)

    def _read_all(self, select: Select) -> list[InterfaceStats]:
        found = [self._read_one(name, path) for name, path in self._entries() if select(name)]
        return sorted(found, key=lambda s: s.ifname)

    def _entries(self) -> list[tuple[str, Path]]:
        entries: list[tuple[str, Path]] = []
        for path in sorted(self._dir.iterdir()):
            if path.is_dir() and (path / "statistics").is_file():
                entries.append((path.name, path))
            elif path.suffix == ".txt" and path.is_file():
                entries.append((path.stem, path))
        return [(name, path) for name, path in entries if name != "lo"]

    @staticmethod
    def _read_one(ifname: str, path: Path) -> InterfaceStats:
        stats_file = path / "statistics" if path.is_dir() else path
        out = InterfaceStats(ifname)
        try:
            out.stats = parse_ethtool_s(stats_file.read_text())
        except EthtoolReadError as exc:
            out.error = str(exc)
        if path.is_dir() and (path / "driver").is_file():
            out.driver = parse_ethtool_i((path / "driver").read_text())
        if path.is_dir() and (path / "settings").is_file():
            out.link = parse_ethtool_settings((path / "settings").read_text())
        return out


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
    return raw.split(b"\0", 1)[0].decode(errors="replace")


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


# ---------------------------------------------------------------------------------------------
# The collector
# ---------------------------------------------------------------------------------------------


def _compile_pattern(pattern: str) -> Callable[[str], bool]:
    """``re:<regex>`` is a full-match regular expression; anything else is a shell glob."""
    if pattern.startswith("re:"):
        regex = re.compile(pattern[3:])
        return lambda name: regex.fullmatch(name) is not None
    return lambda name: fnmatchcase(name, pattern)


class EthtoolOptions(CollectorOptions):
    interfaces: list[str] = []  # globs or ``re:<regex>``; empty = every non-loopback interface
    exclude: list[str] = []
    stats_dir: Path | None = None  # read captured ``ethtool -S`` text instead of the ioctl
    netns: str | None = None  # read inside this named network namespace (or /path/to/ns)
    include_unmapped: bool = False
    include_queues: bool = False

    @field_validator("interfaces", "exclude")
    @classmethod
    def _valid_patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if pattern.startswith("re:"):
                try:
                    re.compile(pattern[3:])
                except re.error as exc:
                    raise ValueError(f"bad regular expression {pattern!r}: {exc}") from exc
        return patterns


def default_source(options: EthtoolOptions) -> EthtoolSource:
    if options.stats_dir is not None:
        return FileSource(options.stats_dir)
    return IoctlSource(options.netns)


@dataclass(frozen=True, slots=True)
class EthtoolFactories(CollectorFactories):
    source: Callable[[EthtoolOptions], EthtoolSource] = default_source


def _sanitized(raw: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", raw)


def drop_sanitized_clashes(raw_names: Sequence[str]) -> set[str]:
    """Raw names whose sanitized form is unique. ``duplicate metric`` and ``duplicate_metric``
    would become one series downstream; like node_exporter's ethtool collector, drop both."""
    by_clean: dict[str, list[str]] = {}
    for raw in raw_names:
        by_clean.setdefault(_sanitized(raw), []).append(raw)
    return {group[0] for group in by_clean.values() if len(group) == 1}


class EthtoolCollector:
    name: ClassVar[str] = "ethtool"
    Options = EthtoolOptions

    def __init__(self, ctx: CollectorContext) -> None:
        assert isinstance(ctx.options, EthtoolOptions)
        self._opts = ctx.options
        self._source = ctx.factories_for(EthtoolFactories).source(self._opts)
        self._include = [_compile_pattern(p) for p in self._opts.interfaces]
        self._exclude = [_compile_pattern(p) for p in self._opts.exclude]
        self._logged: set[tuple[str, str]] = set()

    def select(self, ifname: str) -> bool:
        if any(match(ifname) for match in self._exclude):
            return False
        return not self._include or any(match(ifname) for match in self._include)

    async def collect(self) -> Sequence[Reading]:
        readings: list[Reading] = []
        for snap in await self._source.read(self.select):
            if snap.error:
                self._log_once(snap.ifname, snap.error)
                continue
            readings.extend(self.stat_readings(snap.ifname, snap.stats))
            readings.extend(_info_readings(snap))
        return readings

    async def close(self) -> None:
        close = getattr(self._source, "close", None)
        if close is not None:
            await asyncio.to_thread(close)  # joins the ioctl worker thread

    def stat_readings(self, ifname: str, stats: Mapping[str, int]) -> list[Reading]:
        mapped, seen = [], set()
        unmapped = []
        for raw, value in stats.items():
            found = neutral(raw)
            if found is not None and (found.name, found.priority) not in seen:
                seen.add((found.name, found.priority))
                labels = labels_of({"priority": found.priority} if found.priority else None)
                mapped.append(_reading(ifname, raw, found.convert(value), found.unit, labels, found.name, found.scale))
            elif found is None and self._wanted_unmapped(raw):
                unmapped.append(raw)
        kept = drop_sanitized_clashes(unmapped)
        mapped.extend(_reading(ifname, raw, stats[raw], "", (), "", 1.0) for raw in unmapped if raw in kept)
        return mapped

    def _wanted_unmapped(self, raw: str) -> bool:
        return self._opts.include_queues if is_queue_stat(raw) else self._opts.include_unmapped

    def _log_once(self, ifname: str, error: str) -> None:
        if (ifname, error) not in self._logged:
            self._logged.add((ifname, error))
            log.warning("ethtool: %s: %s (skipped)", ifname, error)


def _reading(ifname: str, raw: str, value: float, unit: str, labels: Labels, name: str, scale: float) -> Reading:
    # ethtool statistics are u64 in the ioctl ABI (struct ethtool_stats.data).
    return Reading(SOURCE, ifname, "", raw, value, unit, Kind.COUNTER, labels, name, 64, False, scale)


def _gauge(ifname: str, counter: str, value: float, unit: str, name: str) -> Reading:
    return Reading(SOURCE, ifname, "", counter, value, unit, Kind.GAUGE, (), name, 0)


def _info_readings(snap: InterfaceStats) -> list[Reading]:
    out: list[Reading] = []
    if snap.driver is not None:
        d = snap.driver
        info = {"driver": d.driver, "version": d.version, "firmware_version": d.firmware_version}
        labels = labels_of({**info, "bus_info": d.bus_info})
        out.append(Reading(SOURCE, snap.ifname, "", "driver_info", 1.0, "", Kind.INFO, labels, "driver_info", 0))
    link = snap.link
    if link is not None and link.speed_mbps is not None:
        # Mb/s -> bytes/s (x 1e6 / 8); named like the infiniband collector's port rate.
        out.append(_gauge(snap.ifname, "speed", link.speed_mbps * 125_000.0, "bytes_per_second", "link_rate"))
    if link is not None and link.link_detected is not None:
        out.append(_gauge(snap.ifname, "link_detected", float(link.link_detected), "", "link_detected"))
    return out
