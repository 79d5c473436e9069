"""NIC statistics (``ethtool -S``) through the SIOCETHTOOL ioctl, mapped to vendor-neutral names.

The side effect sits behind ``EthtoolSource`` (one method): the default reads the kernel through
the ioctl (``fabricd.ethtool_ioctl``; never an ``ethtool`` subprocess: node_exporter bans shelling
out from routine collectors); ``FileSource`` reads captured ``ethtool -S`` text, which tests and the
simulator feed. Parsing of that text is pure and lives in ``fabricd.parsers.ethtool``.

Cardinality is bounded on purpose (ethtool made 57% of one host's series in a peer exporter): only
statistics with a neutral name (``fabricd.drivers.ethtool``) are emitted unless ``include_unmapped`` is
on, and per-queue statistics only with ``include_queues``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import ClassVar, Protocol

from pydantic import field_validator

from fabricd.collector import CollectorContext, CollectorFactories, CollectorOptions
from fabricd.drivers.ethtool import is_queue_stat, neutral
from fabricd.ethtool_ioctl import InterfaceStats, IoctlSource, Select
from fabricd.model import Kind, Labels, Reading, labels_of
from fabricd.parsers.ethtool import EthtoolReadError, parse_ethtool_i, parse_ethtool_s, parse_ethtool_settings

log = logging.getLogger(__name__)

SOURCE = "ethtool"


# ---------------------------------------------------------------------------------------------
# The source seam
# ---------------------------------------------------------------------------------------------


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
            readings.extend(self.stat_readings(snap.ifname, snap.stats, snap.driver.driver if snap.driver else ""))
            readings.extend(_info_readings(snap))
        return readings

    async def close(self) -> None:
        close = getattr(self._source, "close", None)
        if close is not None:
            await asyncio.to_thread(close)  # joins the ioctl worker thread

    def stat_readings(self, ifname: str, stats: Mapping[str, int], driver: str = "") -> list[Reading]:
        """Mapped by the interface's own driver table when ``ethtool -i`` named it, else by every table."""
        mapped, seen = [], set()
        unmapped = []
        for raw, value in stats.items():
            found = neutral(raw, driver)
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
