"""InfiniBand / RoCE HCA counters from ``<sysfs>/class/infiniband`` (kernel ABI ``sysfs-class-infiniband``).

Per device: ``fw_ver``, ``board_id``, ``hca_type``, ``node_guid`` (one INFO reading) and device-level
``hw_counters/`` (port ``""``). Per port: ``counters/`` (PMA PortCounters/PortCountersExtended),
``counters_ext/`` (pre-4.5 kernels, ``*_64``), ``hw_counters/`` (driver counters, kernel >= 4.6),
``state``/``phys_state``/``rate`` gauges, one port INFO reading (``link_layer``, state names, ``netdev``).

Cost per scrape matters (a node polls every second): the tree is discovered once, counter files stay
open and are re-read with ``pread(fd, 64, 0)`` (a sysfs read at offset 0 regenerates the value),
values are parsed with ``int()``. The tree is re-discovered when the device listing changes (names or
inodes: a driver reload re-creates the device folders), when a read fails (``ENODEV`` after
hot-unplug, ``ENOENT``), and every ``rescan_every`` scrapes (new ``hw_counters``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar

from pydantic import Field

from fabricd.collector import CollectorContext, CollectorFactories, CollectorOptions
from fabricd.drivers import ib
from fabricd.drivers.ib import Counter
from fabricd.drivers.ib.sysfs import counter_spec, effective_width, parse_rate, parse_state, parse_value, text_of
from fabricd.model import Kind, Labels, Reading, labels_of
from fabricd.netdev import port_netdev
from fabricd.worker import Worker, WorkerThread

log = logging.getLogger("fabricd.collectors.infiniband")

SOURCE = "infiniband"
MAX_LABEL_CHARS = 128  # strings from the device become label values: bound them
_READ_SIZE = 64  # enough for "18446744073709551615\n" and "N/A (no PMA)\n"
_ATTR_SIZE = 4096
T = TypeVar("T")
_ATTRIBUTE = Counter("", "", "", 0, kind=Kind.GAUGE, source="port attribute file")  # state, phys_state, rate


# --- discovery (I/O) ----------------------------------------------------------------------------


@dataclass(slots=True)
class CounterFile:
    """An open counter file and what its value means."""

    path: str
    fd: int | None
    device: str
    port: str
    counter: str
    spec: Counter
    # The last content read and its Reading: an unchanged file (most error counters, most of the
    # time) reuses the immutable Reading instead of building a new one (the costliest step).
    last_data: bytes | None = None
    last: Reading | None = None
    series: tuple[str, str, str, str, Labels] | None = None  # every reading's key(), built once

    def reading(self, raw: int) -> Reading:
        spec = self.spec
        width, saturates = effective_width(spec, raw)
        r = Reading(
            SOURCE,
            self.device,
            self.port,
            self.counter,
            float(raw * spec.scale),
            spec.unit,
            spec.kind,
            (),
            spec.name,
            width,
            saturates,
            float(spec.scale),
        )
        if self.series is None:
            self.series = r.key()
        r.series = self.series
        return r


@dataclass(slots=True)
class PortFiles:
    device: str
    port: str
    link_layer: str
    state: CounterFile | None
    phys_state: CounterFile | None
    rate: CounterFile | None
    netdev: str = ""  # its network interface (RoCE; sysfs gid_attrs/ndevs, or the device's net/)
    last_raw: tuple[bytes | None, ...] = ()  # (state, phys_state, rate) as last read
    last_readings: list[Reading] = field(default_factory=list)


@dataclass
class Plan:
    """What one discovery found; reused until the tree changes."""

    signature: tuple[tuple[str, int], ...] | None
    counters: list[CounterFile] = field(default_factory=list)
    ports: list[PortFiles] = field(default_factory=list)
    infos: list[Reading] = field(default_factory=list)

    def close(self) -> None:
        for f in self._files():
            if f.fd is not None:
                os.close(f.fd)
                f.fd = None

    def _files(self) -> Iterator[CounterFile]:
        yield from self.counters
        for p in self.ports:
            yield from (f for f in (p.state, p.phys_state, p.rate) if f is not None)


def signature(top: Path) -> tuple[tuple[str, int], ...] | None:
    """Device names and folder inodes: changes when a device appears, vanishes or is re-created."""
    try:
        with os.scandir(top) as it:
            return tuple(sorted((e.name, _inode(e)) for e in it))
    except (FileNotFoundError, NotADirectoryError):
        return None


def _inode(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat().st_ino  # follows the class/infiniband/<dev> symlink to the device folder
    except OSError:
        return -1


class _Discovery:
    """Walks the tree once and opens the files to re-read; the open-file budget is bounded.

    Paths are plain strings joined with "/" (pathlib costs more than the walk's system calls, and
    the walk is repeated every ``rescan_every`` scrapes).
    """

    def __init__(self, top: Path, max_open: int) -> None:
        self.top = str(top)
        self.budget = max_open
        self.plan = Plan(signature(top))

    def run(self) -> Plan:
        for name in sorted(n for n, _ in self.plan.signature or ()):
            try:
                self._device(f"{self.top}/{name}", name)
            except OSError as exc:  # vanished mid-walk: the next scrape's signature differs
                log.debug("infiniband: skipping %s: %s", name, exc)
        return self.plan

    def _device(self, path: str, device: str) -> None:
        attrs = {k: _read_attr(f"{path}/{k}") for k in ("fw_ver", "board_id", "hca_type", "node_guid")}
        self.plan.infos.append(_device_info(device, attrs))
        driver = ib.driver_name(device, attrs["hca_type"] or "", _kernel_driver(path))
        self._folder(path, "hw_counters", device, "", legacy=False, driver=driver)
        ports = f"{path}/ports"
        for port in sorted(_listdir(ports), key=_port_order):
            self._port(f"{ports}/{port}", device, port, driver)

    def _port(self, path: str, device: str, port: str, driver: str) -> None:
        legacy = os.path.isdir(f"{path}/counters_ext")
        for folder in ("counters", "counters_ext", "hw_counters"):
            self._folder(path, folder, device, port, legacy=legacy, driver=driver)
        self.plan.ports.append(
            PortFiles(
                device,
                port,
                _read_attr(f"{path}/link_layer") or "",
                self._open(f"{path}/state", device, port, "state", _ATTRIBUTE),
                self._open(f"{path}/phys_state", device, port, "phys_state", _ATTRIBUTE),
                self._open(f"{path}/rate", device, port, "rate", _ATTRIBUTE),
                port_netdev(path),
            )
        )

    def _folder(self, parent: str, folder: str, device: str, port: str, *, legacy: bool, driver: str) -> None:
        path = f"{parent}/{folder}"
        for counter in sorted(_listdir(path)):
            spec = counter_spec(folder, counter, legacy=legacy, driver=driver)
            if spec is not None:
                f = self._open(f"{path}/{counter}", device, port, counter, spec)
                if f is not None:
                    self.plan.counters.append(f)

    def _open(self, path: str, device: str, port: str, counter: str, spec: Counter) -> CounterFile | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC) if self.budget > 0 else None
        except FileNotFoundError:
            return None
        except OSError:
            fd = None  # unreadable now (EACCES): retried by path on every scrape
        if fd is not None:
            self.budget -= 1
        elif not os.path.exists(path):
            return None
        return CounterFile(path, fd, device, port, counter, spec)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []  # bnxt_re has no counters/; pre-4.6 kernels have no hw_counters/


def _kernel_driver(path: str) -> str:
    """The driver bound to the device's parent (``<dev>/device/driver`` -> .../drivers/mlx5_core)."""
    try:
        return os.path.basename(os.readlink(f"{path}/device/driver"))
    except OSError:
        return ""  # no link (test trees, some virtual devices): the tables match by name


def _port_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def _read_attr(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return text_of(f.read(_ATTR_SIZE))[:MAX_LABEL_CHARS]
    except OSError:
        return None  # optional: hfi1 has no hca_type, older kernels no node_guid


def _device_info(device: str, attrs: dict[str, str | None]) -> Reading:
    labels = labels_of(
        {
            "firmware_version": attrs["fw_ver"] or "",
            "board_id": attrs["board_id"] or "",
            "hca_type": attrs["hca_type"] or "",
            "node_guid": attrs["node_guid"] or "",
        }
    )
    return Reading(SOURCE, device, "", "info", 1.0, "", Kind.INFO, labels, "device_info", 0)


def _gauge(p: PortFiles, counter: str, value: float, unit: str, name: str) -> Reading:
    return Reading(SOURCE, p.device, p.port, counter, value, unit, Kind.GAUGE, (), name, 0)


def pread_path(path: str) -> bytes:
    """Read a file over the open-file budget: open, read at offset 0, close."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, _READ_SIZE, 0)
    finally:
        os.close(fd)


def port_readings(p: PortFiles, state_b: bytes | None, phys_b: bytes | None, rate_b: bytes | None) -> list[Reading]:
    """The port's gauges (state id, physical state id, rate) and its INFO reading."""
    state = _parsed(state_b, parse_state)
    phys = _parsed(phys_b, parse_state)
    rate = _parsed(rate_b, parse_rate)
    out: list[Reading] = []
    if state is not None:
        out.append(_gauge(p, "state", float(state[0]), "", "port_state"))
    if phys is not None:
        out.append(_gauge(p, "phys_state", float(phys[0]), "", "port_physical_state"))
    if rate is not None:
        out.append(_gauge(p, "rate", rate, "bytes_per_second", "link_rate"))
    names = {"link_layer": p.link_layer, "state": state[1] if state else "", "phys_state": phys[1] if phys else ""}
    labels = labels_of(names | ({"netdev": p.netdev} if p.netdev else {}))
    out.append(Reading(SOURCE, p.device, p.port, "port_info", 1.0, "", Kind.INFO, labels, "port_info", 0))
    return out


def _parsed(data: bytes | None, parse: Callable[[bytes], T]) -> T | None:
    if data is None:
        return None
    try:
        return parse(data)
    except ValueError:
        log.debug("infiniband: garbled attribute %r", data)  # skipped, never reported as zero
        return None


# --- the collector ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InfinibandFactories(CollectorFactories):
    # The executor of the blocking reads, given the thread's name: a thread of our own in the
    # agent; ``fabricd eval`` runs hundreds of nodes' reads of tmpfs inline instead.
    worker: Callable[[str], Worker] = WorkerThread


class InfinibandCollector:
    """Reads every HCA's port counters, hw_counters, states and rates."""

    name: ClassVar[str] = "infiniband"

    class Options(CollectorOptions):
        rescan_every: int = Field(60, ge=1, description="scrapes between full re-discoveries of the tree")
        max_open_files: int = Field(1024, ge=0, description="counter files kept open between scrapes")

    def __init__(self, ctx: CollectorContext) -> None:
        opts = ctx.options if isinstance(ctx.options, self.Options) else self.Options.model_validate({})
        self.top = ctx.sysfs_root / "class" / "infiniband"
        self.rescan_every = opts.rescan_every
        self.max_open_files = opts.max_open_files
        self.discoveries = 0  # how often the tree was walked (tests, debugging)
        self._plan: Plan | None = None
        self._scrapes_since_discovery = 0
        self._stale = False
        self._said_no_devices = False
        self._worker = ctx.factories_for(InfinibandFactories).worker(f"fabricd-{self.name}")

    async def collect(self) -> Sequence[Reading]:
        # sysfs reads can block (hw_counters query the firmware): keep them off the event loop, in
        # one call per scrape on a thread of our own (cheaper per scrape than asyncio.to_thread).
        return await self._worker.run(self.scrape)

    def close(self) -> None:
        self._worker.close()
        self._close_plan()

    def _close_plan(self) -> None:
        if self._plan is not None:
            self._plan.close()
            self._plan = None

    def scrape(self) -> list[Reading]:
        """One synchronous scrape (``collect`` runs it in a thread)."""
        plan = self._current_plan()
        if not plan.signature:
            self._log_no_devices()
            return []
        self._said_no_devices = False
        out = list(plan.infos)
        self._read_counters(plan, out)
        for port in plan.ports:
            self._read_port(port, out)
        return out

    def _current_plan(self) -> Plan:
        self._scrapes_since_discovery += 1
        plan = self._plan
        if (
            plan is None
            or self._stale
            or self._scrapes_since_discovery > self.rescan_every
            or signature(self.top) != plan.signature
        ):
            self._close_plan()
            plan = self._plan = _Discovery(self.top, self.max_open_files).run()
            self.discoveries += 1
            self._scrapes_since_discovery = 1
            self._stale = False
        return plan

    def _read_counters(self, plan: Plan, out: list[Reading]) -> None:
        # The hot loop (hundreds of files per scrape): the read is inlined rather than a _pread call,
        # and an unchanged file reuses its Reading.
        append = out.append
        pread = os.pread
        for f in plan.counters:
            try:
                data = pread(f.fd, _READ_SIZE, 0) if f.fd is not None else pread_path(f.path)
            except OSError as exc:
                self._unreadable(f, exc)
                continue
            last = f.last
            if last is not None and data == f.last_data:
                append(last)
                continue
            raw = parse_value(data)  # None: N/A (no PMA) or garbled, which produce no reading
            f.last_data, f.last = data, (None if raw is None else f.reading(raw))
            if f.last is not None:
                append(f.last)

    def _pread(self, f: CounterFile | None) -> bytes | None:
        if f is None:
            return None
        try:
            return os.pread(f.fd, _READ_SIZE, 0) if f.fd is not None else pread_path(f.path)
        except OSError as exc:
            self._unreadable(f, exc)
            return None

    def _unreadable(self, f: CounterFile, exc: OSError) -> None:
        # ENODEV: the device went away under us; ENOENT: a file vanished. Re-discover next time.
        log.debug("infiniband: cannot read %s: %s", f.path, exc)
        self._stale = True

    def _read_port(self, p: PortFiles, out: list[Reading]) -> None:
        raw = (self._pread(p.state), self._pread(p.phys_state), self._pread(p.rate))
        if raw != p.last_raw:
            p.last_raw, p.last_readings = raw, port_readings(p, *raw)
        out.extend(p.last_readings)

    def _log_no_devices(self) -> None:
        if not self._said_no_devices:
            log.info("infiniband: no devices under %s", self.top)
            self._said_no_devices = True
