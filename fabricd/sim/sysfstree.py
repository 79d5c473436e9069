"""Write realistic ``/sys/class/infiniband`` trees: for tests, parity checks and the simulator.

The layout and file formats follow the real captures in ``tests/cases/infiniband/`` (from
prometheus/procfs, prometheus/node_exporter and leptonai/gpud; see their ORIGIN.md):

    <root>/class/infiniband/<dev>/{fw_ver,board_id,hca_type,node_guid}
    <root>/class/infiniband/<dev>/hw_counters/<name>                  (device-level, optional)
    <root>/class/infiniband/<dev>/ports/<p>/{state,phys_state,rate,link_layer}
    <root>/class/infiniband/<dev>/ports/<p>/{counters,counters_ext,hw_counters}/<name>
    <root>/class/infiniband/<dev>/ports/<p>/gid_attrs/ndevs/<index>   (RoCE, optional)

``root`` plays the role of ``/sys`` (node_exporter's ``--path.sysfs``). Values are written the way
the kernel writes them: raw sysfs numbers (``port_xmit_data`` in 4-octet words, not bytes),
``state`` as ``"4: ACTIVE"``, ``rate`` as ``"400 Gb/sec (4X NDR)"``.

A value is an ``int`` (written as ``"<n>\\n"``), a ``str`` (written with a newline appended, e.g.
``"N/A (no PMA)"``) or a ``Raw`` string written byte for byte (``Raw("42")`` has no trailing
newline, ``Raw("InfiniBand\\n\\n")`` has two). ``None`` in an optional field means "no such file or
folder" (Broadcom ``bnxt_re`` has no ``counters/``; Omni-Path ``hfi1`` has no ``hca_type``).

``write_infiniband_tree`` makes the tree on disk equal to the mapping: files are rewritten in place
(same inode, like sysfs attributes, so a reader holding them open sees the new value), files and
devices absent from the mapping are removed.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fabricd.drivers.ib import bnxt_re, mlx5, pma
from fabricd.model import Kind


class Raw(str):
    """File content written verbatim (no newline added)."""


Value = int | str
Counters = Mapping[str, Value]

# Counter names and widths from the tables the collector reads (fabricd/drivers/ib/): one copy.
PORT_COUNTERS_BASE: dict[str, int] = {c.raw: c.width for c in pma.BASE}  # narrow, saturating
PORT_COUNTERS_DATA: tuple[str, ...] = tuple(c.raw for c in pma.DATA)
PORT_COUNTERS_EXT_ONLY: tuple[str, ...] = tuple(c.raw for c in pma.EXT_ONLY)
COUNTERS_EXT: tuple[str, ...] = tuple(c.raw for c in pma.COUNTERS_EXT)
# The mlx5 counters every ConnectX-7 has (the optional ones need a newer kernel or firmware: the
# gpud capture the simulator copies has none of them).
MLX5_Q_COUNTERS: tuple[str, ...] = tuple(sorted(c.raw for c in mlx5.Q_COUNTERS if not c.optional))
MLX5_CONG_COUNTERS: tuple[str, ...] = tuple(sorted(c.raw for c in mlx5.CONGESTION))

STATES: dict[int, str] = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATES: dict[int, str] = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}
RATES: tuple[str, ...] = (
    "2.5 Gb/sec (1X SDR)",
    "10 Gb/sec (4X)",
    "25 Gb/sec (1X EDR)",
    "40 Gb/sec (4X QDR)",
    "100 Gb/sec (4X EDR)",
    "200 Gb/sec (4X HDR)",
    "200 Gb/sec (2X NDR)",
    "400 Gb/sec (4X NDR)",
)


@dataclass(frozen=True)
class PortTree:
    """One ``ports/<p>/`` folder. ``None`` = file or folder absent."""

    state: Value | None = "4: ACTIVE"
    phys_state: Value | None = "5: LinkUp"
    rate: Value | None = "400 Gb/sec (4X NDR)"
    link_layer: Value | None = "InfiniBand"
    counters: Counters | None = field(default_factory=dict)
    counters_ext: Counters | None = None
    hw_counters: Counters | None = None
    ndevs: Mapping[str, Value] | None = None  # gid_attrs/ndevs/<GID index>: the netdev (RoCE)


@dataclass(frozen=True)
class DeviceTree:
    """One ``class/infiniband/<dev>/`` folder. ``None`` = file or folder absent."""

    fw_ver: Value | None = "28.41.1000"
    board_id: Value | None = "MT_0000000838"
    hca_type: Value | None = "MT4129"
    node_guid: Value | None = None
    ports: Mapping[str, PortTree] = field(default_factory=lambda: {"1": PortTree()})
    hw_counters: Counters | None = None


def render(value: Value) -> bytes:
    """The bytes a sysfs file holds for ``value``."""
    if isinstance(value, Raw):
        return value.encode()
    return f"{value}\n".encode()


def tree_files(devices: Mapping[str, DeviceTree]) -> dict[Path, bytes | None]:
    """Relative path (under ``class/infiniband``) -> content, or ``None`` for a (counter) folder."""
    return dict(_device_files(devices))


def _device_files(devices: Mapping[str, DeviceTree]) -> Iterator[tuple[Path, bytes | None]]:
    for name, dev in devices.items():
        base = Path(name)
        attrs = {"fw_ver": dev.fw_ver, "board_id": dev.board_id, "hca_type": dev.hca_type, "node_guid": dev.node_guid}
        yield from _attr_files(base, attrs)
        yield from _counter_files(base / "hw_counters", dev.hw_counters)
        for port_name, port in dev.ports.items():
            yield from _port_files(base / "ports" / str(port_name), port)


def _port_files(base: Path, port: PortTree) -> Iterator[tuple[Path, bytes | None]]:
    attrs = {"state": port.state, "phys_state": port.phys_state, "rate": port.rate, "link_layer": port.link_layer}
    yield from _attr_files(base, attrs)
    yield from _counter_files(base / "counters", port.counters)
    yield from _counter_files(base / "counters_ext", port.counters_ext)
    yield from _counter_files(base / "hw_counters", port.hw_counters)
    if port.ndevs is not None:
        yield base / "gid_attrs", None
        yield base / "gid_attrs" / "ndevs", None
        yield from _attr_files(base / "gid_attrs" / "ndevs", port.ndevs)


def _attr_files(base: Path, attrs: Mapping[str, Value | None]) -> Iterator[tuple[Path, bytes | None]]:
    for name, value in attrs.items():
        if value is not None:
            yield base / name, render(value)


def _counter_files(folder: Path, counters: Counters | None) -> Iterator[tuple[Path, bytes | None]]:
    if counters is None:
        return
    yield folder, None  # the folder itself, so an empty counters/ still exists
    for name, value in counters.items():
        yield folder / name, render(value)


def write_infiniband_tree(root: Path, devices: Mapping[str, DeviceTree]) -> Path:
    """Make ``<root>/class/infiniband`` equal to ``devices``; return that folder."""
    top = root / "class" / "infiniband"
    top.mkdir(parents=True, exist_ok=True)
    wanted = tree_files(devices)
    _remove_unwanted(top, {top / p for p in wanted})
    for rel, data in wanted.items():
        if data is None:
            (top / rel).mkdir(parents=True, exist_ok=True)
        else:
            (top / rel).parent.mkdir(parents=True, exist_ok=True)
            write_in_place(top / rel, data)
    return top


def write_in_place(path: str | os.PathLike[str], data: bytes) -> None:
    """Rewrite one attribute file like sysfs does (the simulator's hot path: no mkdir here).

    pwrite + ftruncate keeps the inode (sysfs attributes never change inode), so readers that
    keep the file open see the new value; a concurrent reader sees the old or the new number on
    the first line (a shorter value is truncated right after the write)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o444)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _remove_unwanted(top: Path, wanted: set[Path]) -> None:
    keep = set(wanted)
    for path in wanted:
        keep.update(path.parents)
    for dirpath, dirnames, filenames in os.walk(top, topdown=True):
        here = Path(dirpath)
        for name in filenames:
            if here / name not in keep:
                (here / name).unlink()
        for name in list(dirnames):
            if here / name not in keep:
                shutil.rmtree(here / name)
                dirnames.remove(name)


# --- randomized trees (parity tests, fuzzing) --------------------------------------------------

KINDS: tuple[str, ...] = ("mlx5", "mlx4_legacy", "iwarp", "bnxt_re", "hfi1")
# The kernel's device names per kind (ib_register_device's "mlx5_%d", "bnxt_re%d", ...).
DEVICE_NAMES: dict[str, str] = {
    "mlx5": "mlx5_",
    "mlx4_legacy": "mlx4_",
    "iwarp": "i40iw",
    "bnxt_re": "bnxt_re",
    "hfi1": "hfi1_",
}


def random_tree(root: Path, rng: random.Random, kinds: tuple[str, ...] = KINDS) -> dict[str, DeviceTree]:
    """Write a random but realistic tree under ``root`` and return its description.

    Mixes the quirks seen in real captures: iWARP ``N/A (no PMA)``, no ``counters/`` (bnxt_re),
    pre-4.5 ``counters_ext/``, missing files, no trailing newline, ``InfiniBand\\n\\n``, values
    above 2^32, narrow counters saturated at all ones. Data counters stay below 2^61 words so that
    ``x 4`` fits in 64 bits (node_exporter multiplies in uint64). ``kinds`` restricts the device
    kinds (node_exporter 1.5 drops the whole tree when one port lacks ``counters/``: no bnxt_re).
    """
    devices: dict[str, DeviceTree] = {}
    for i in range(rng.randint(0, 4)):
        kind = rng.choice(kinds)
        devices[f"{DEVICE_NAMES[kind]}{i}"] = _random_device(kind, rng)
    write_infiniband_tree(root, devices)
    return devices


def _random_device(kind: str, rng: random.Random) -> DeviceTree:
    ports = {str(p): _random_port(kind, rng) for p in range(1, rng.randint(1, 2) + 1)}
    hw = _random_counters(MLX5_CONG_COUNTERS, 64, rng) if kind == "mlx5" and rng.random() < 0.3 else None
    return DeviceTree(
        fw_ver=_maybe_raw(f"{rng.randint(2, 28)}.{rng.randint(0, 45)}.{rng.randint(1000, 9999)}", rng),
        board_id=f"MT_{rng.randint(0, 10**10):010d}",  # node_exporter 1.5 requires it
        hca_type=None if kind == "hfi1" or rng.random() < 0.1 else f"MT{rng.randint(4099, 4129)}",
        node_guid=None if rng.random() < 0.3 else _maybe_raw(_random_guid(rng), rng),
        ports=ports,
        hw_counters=hw,
    )


def _random_port(kind: str, rng: random.Random) -> PortTree:
    state = rng.choice(list(STATES))
    phys = rng.choice(list(PHYS_STATES))
    layer = rng.choice(["InfiniBand", Raw("InfiniBand\n\n"), "Ethernet"])
    return PortTree(
        state=_maybe_raw(f"{state}: {STATES[state]}", rng),
        phys_state=_maybe_raw(f"{phys}: {PHYS_STATES[phys]}", rng),
        rate=_maybe_raw(rng.choice(RATES), rng),
        link_layer=layer,
        counters=_random_port_counters(kind, rng),
        counters_ext=_random_ext(rng) if kind == "mlx4_legacy" else None,
        hw_counters=_random_hw(kind, rng),
    )


def _random_port_counters(kind: str, rng: random.Random) -> Counters | None:
    if kind == "bnxt_re":
        return None
    names = [*PORT_COUNTERS_BASE, *PORT_COUNTERS_DATA]
    if kind in {"mlx5", "mlx4_legacy"}:
        names += PORT_COUNTERS_EXT_ONLY
    if kind == "iwarp":
        return {n: "N/A (no PMA)" for n in names}
    counters: dict[str, Value] = {}
    for name in names:
        if rng.random() < 0.1:
            continue  # a missing file
        width = PORT_COUNTERS_BASE.get(name, 64 if kind != "mlx4_legacy" else 32)
        counters[name] = _maybe_raw(_random_value(width, rng, saturating=name in PORT_COUNTERS_BASE), rng)
    return counters


def _random_ext(rng: random.Random) -> Counters:
    return {n: _maybe_raw(_random_value(61, rng, saturating=False), rng) for n in COUNTERS_EXT}


def _random_hw(kind: str, rng: random.Random) -> Counters | None:
    if kind == "mlx5":
        hw = dict(_random_counters(MLX5_Q_COUNTERS, 32, rng))
        hw.update(_random_counters(MLX5_CONG_COUNTERS, 61, rng))
        hw["lifespan"] = "10"
        return hw
    if kind == "bnxt_re":  # every counter of a gen P5 chip; the levels (active_qps) stay small
        rows = bnxt_re.DRIVER.counters
        hw = dict(_random_counters(tuple(c.raw for c in rows if c.kind is Kind.COUNTER), 61, rng))
        hw.update(_random_counters(tuple(c.raw for c in rows if c.kind is Kind.GAUGE), 14, rng))
        return hw
    return None


def _random_counters(names: tuple[str, ...], width: int, rng: random.Random) -> Counters:
    return {n: _maybe_raw(_random_value(width, rng, saturating=False), rng) for n in names}


def _random_value(width: int, rng: random.Random, *, saturating: bool) -> int:
    top = (1 << min(width, 61)) - 1
    roll = rng.random()
    if saturating and roll < 0.15:
        return (1 << width) - 1  # clamped at all ones
    if roll < 0.3:
        return 0
    if roll < 0.5 and width > 32:
        return rng.randint(1 << 32, top)  # above 32 bits: catches 32-bit truncation
    return rng.randint(0, min(top, 10**6))


def _maybe_raw(value: Value, rng: random.Random) -> Value:
    return Raw(str(value)) if rng.random() < 0.15 else value  # no trailing newline


def _random_guid(rng: random.Random) -> str:
    return ":".join(f"{rng.randint(0, 0xFFFF):04x}" for _ in range(4))
