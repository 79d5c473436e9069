"""InfiniBand/RDMA counter tables: the IBA ``counters/`` (``pma.py``) and one module per driver.

A driver module defines ``DRIVER = HwDriver(...)`` and is found by ``drivers()`` (pkgutil): adding
one needs no other change (``fabricd/drivers/__init__.py`` says how). ``identify`` picks the driver
of a device; ``hw_counter`` the row of one ``hw_counters/`` file, or a safe default for a counter
no table knows (64 bit, unit guessed from the name, the raw name kept).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field

from fabricd.drivers import discover
from fabricd.model import Kind

# Not a counter: the cache time in ms of the hw_counters values, one per folder
# (drivers/infiniband/core/sysfs.c, ``lifespan`` attribute of every hw_counters group).
NOT_COUNTERS = frozenset({"lifespan"})
_NOT_DRIVERS = frozenset({"pma", "perfquery", "sysfs"})  # modules of this package that hold no hw_counters driver


class Overflow(enum.StrEnum):
    """What a counter narrower than 64 bits does at all ones."""

    SATURATES = "saturates"  # stays at 2^width - 1 (IBA PortCounters: "shall not wrap")
    WRAPS = "wraps"  # goes on from 0 (mlx5 32-bit Q counters)


@dataclass(frozen=True, slots=True)
class Counter:
    """One raw counter file and what its value means.

    ``name`` is the neutral name readings carry (``fabricd.drivers.vocabulary``); only the default
    row of a counter no table knows carries its Prometheus-safe raw name instead (``""`` when the
    raw name already is one). ``width`` applies to the raw value, before ``scale``.
    """

    raw: str
    name: str
    unit: str
    width: int = 64
    overflow: Overflow = Overflow.WRAPS
    kind: Kind = Kind.COUNTER
    scale: int = 1
    help: str = ""
    source: str = ""
    optional: bool = False  # not on every kernel or firmware (the simulator writes only the others)

    @property
    def saturates(self) -> bool:
        return self.overflow is Overflow.SATURATES and self.width < 64


@dataclass(frozen=True, eq=False)
class HwDriver:
    """One RDMA driver's ``hw_counters/`` table and the devices it claims."""

    name: str
    counters: tuple[Counter, ...]
    source: str
    kernel_drivers: tuple[str, ...] = ()  # basename of the <dev>/device/driver link
    device_prefixes: tuple[str, ...] = ()  # kernel device names (mlx5_0, bnxt_re0)
    hca_type_prefixes: tuple[str, ...] = ()  # for renamed devices (rdma-core persistent names)
    table: dict[str, Counter] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "table", {c.raw: c for c in self.counters})

    def claims(self, device: str, hca_type: str, kernel_driver: str) -> bool:
        """The kernel driver decides when its link is there (tests' trees have none): names can be
        changed (rdma-core's persistent naming renames mlx5_0 to ibp3s0 or rocep3s0f0)."""
        if kernel_driver:
            return kernel_driver in self.kernel_drivers
        return device.startswith(self.device_prefixes) or (
            bool(self.hca_type_prefixes) and hca_type.startswith(self.hca_type_prefixes)
        )


@functools.cache
def drivers() -> tuple[HwDriver, ...]:
    """Every driver module of this package, by module name."""
    return discover(__name__, __path__, HwDriver, _NOT_DRIVERS)


def identify(device: str, hca_type: str = "", kernel_driver: str = "") -> HwDriver | None:
    """The driver of a device: by its kernel driver when the link is there, else by its name, else
    by ``hca_type``. None: a driver no table knows (its counters are read with the defaults)."""
    return next((d for d in drivers() if d.claims(device, hca_type, kernel_driver)), None)


def driver_name(device: str, hca_type: str = "", kernel_driver: str = "") -> str:
    """``identify``'s driver name, ``""`` for a device no table claims (``hw_counter``'s argument)."""
    found = identify(device, hca_type, kernel_driver)
    return found.name if found is not None else ""


def by_name(name: str) -> HwDriver | None:
    return next((d for d in drivers() if d.name == name), None)


def hw_counter(driver: str, raw: str) -> Counter | None:
    """The row of ``hw_counters/<raw>`` for driver ``driver`` (``""``: unknown); None: not a counter."""
    if raw in NOT_COUNTERS:
        return None
    found = _table(driver).get(raw)
    return found if found is not None else unknown_counter(raw)


@functools.cache
def _table(driver: str) -> dict[str, Counter]:
    d = by_name(driver)
    return d.table if d is not None else {}


def unknown_counter(raw: str, *, guess_unit: bool = True) -> Counter:
    """A counter no table knows: 64 bit (a drop then reads as a reset, the safe reading), unit from
    its name (``hw_counters``), its raw name kept (the catalogue's pattern row covers it)."""
    return Counter(raw, safe_name(raw), _unit_of(raw) if guess_unit else "", source="no table: defaults")


def _unit_of(raw: str) -> str:
    if raw.endswith("_bytes"):
        return "bytes"
    if raw.endswith(("_packets", "_pkts")):
        return "packets"
    return ""


def safe_name(raw: str) -> str:
    """A Prometheus-safe stem for a raw counter name (``""`` when the raw name already is one)."""
    if raw.isascii() and raw.replace("_", "0").isalnum():  # the usual name: nothing to replace
        cleaned = raw.lower()
    else:
        cleaned = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in raw).lower()
    if cleaned[:1].isdigit():
        cleaned = f"_{cleaned}"
    return "" if cleaned == raw else cleaned
