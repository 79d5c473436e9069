"""A ``/sys/class/infiniband`` tree, given as its files' text, as one record per device port.

``files`` maps a path relative to the ``class/infiniband`` folder (``mlx5_0/ports/1/counters/
port_rcv_data``, ``mlx5_0/hca_type``) to the file's content; whoever reads the tree (``fabricd parse
sysfs`` here, the infiniband collector with its own file handles) passes the text, this module reads
it with the attribute parsers and counter tables the collector uses (``fabricd.drivers.ib.sysfs``):
the same neutral names, the same x4 for data words, the same widths and saturation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from fabricd.drivers import ib
from fabricd.drivers.ib.sysfs import counter_spec, effective_width, parse_state, parse_value, text_of
from fabricd.parsers.common import Problem, problem

COUNTER_FOLDERS = ("counters", "counters_ext", "hw_counters")
_DIGITS = re.compile(r"[0-9]{1,20}")
BITS_PER_GBIT = 1_000_000_000


@dataclass(frozen=True, slots=True)
class SysfsPort:
    device: str
    port: int
    link_layer: str | None
    rate_bps: int | None  # bits per second (the rate file says Gb/sec)
    state: str | None  # "ACTIVE", from "4: ACTIVE"
    counters: dict[str, int] = field(default_factory=dict)  # neutral name (else raw) -> base units
    saturated: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SysfsResult:
    devices: list[SysfsPort]
    problems: list[Problem]


def _rate_bps(text: str) -> int | None:
    first = text_of(text).split(maxsplit=1)
    try:
        gbit = float(first[0]) if first else math.nan
    except ValueError:
        return None
    return round(gbit * BITS_PER_GBIT) if math.isfinite(gbit) and gbit >= 0 else None  # not "inf", "nan", "-1"


def _state(text: str | None, where: str, problems: list[Problem]) -> str | None:
    if text is None:
        return None
    try:
        return parse_state(text)[1]
    except ValueError:
        problems.append(problem(0, f"{where}: unreadable state", text))
        return None


def _number(text: str) -> int:
    """A port folder's number; -1 for a name that is not one (``"²".isdigit()`` is true: not that)."""
    return int(text) if _DIGITS.fullmatch(text) else -1


def _ports(files: Mapping[str, str]) -> list[tuple[str, str]]:
    found = {(parts[0], parts[2]) for parts in (p.split("/") for p in files) if len(parts) >= 4 and parts[1] == "ports"}
    return sorted(found, key=lambda dp: (dp[0], _number(dp[1]), dp[1]))


def parse_sysfs(files: Mapping[str, str]) -> SysfsResult:
    """Every ``<device>/ports/<n>`` of the tree, in device then port order; an unreadable counter
    (``N/A (no PMA)``, garbage) is left out and named in ``problems`` unless it is iWARP's N/A."""
    problems: list[Problem] = []
    devices = [_port(files, device, port, problems) for device, port in _ports(files)]
    if not devices:
        problems.append(problem(0, "no <device>/ports/<n> in the tree (is it a class/infiniband folder?)"))
    return SysfsResult(devices, problems)


def _port(files: Mapping[str, str], device: str, port: str, problems: list[Problem]) -> SysfsPort:
    base = f"{device}/ports/{port}"
    driver = ib.driver_name(device, text_of(files.get(f"{device}/hca_type", "")))
    legacy = any(p.startswith(f"{base}/counters_ext/") for p in files)
    record = SysfsPort(
        device,
        _number(port),
        text_of(files[f"{base}/link_layer"]) if f"{base}/link_layer" in files else None,
        _rate_bps(files[f"{base}/rate"]) if f"{base}/rate" in files else None,
        _state(files.get(f"{base}/state"), f"{base}/state", problems),
    )
    for path in sorted(p for p in files if p.startswith(f"{base}/")):
        folder, _, name = path[len(base) + 1 :].partition("/")
        if folder in COUNTER_FOLDERS and name and "/" not in name:
            _counter(record, folder, name, files[path], legacy, driver, problems, path)
    return record


def _counter(
    record: SysfsPort,
    folder: str,
    name: str,
    text: str,
    legacy: bool,
    driver: str,
    problems: list[Problem],
    path: str,
) -> None:
    spec = counter_spec(folder, name, legacy=legacy, driver=driver)
    if spec is None:
        return  # not a counter (hw_counters/lifespan)
    raw = parse_value(text)
    if raw is None:
        if "N/A" not in text:  # iWARP devices answer "N/A (no PMA)": no counter, not a fault
            problems.append(problem(0, f"{path}: not a counter value", text))
        return
    neutral = spec.name or name
    record.counters[neutral] = raw * spec.scale
    width, saturates = effective_width(spec, raw)
    if saturates and raw >= (1 << width) - 1:
        record.saturated.append(neutral)
