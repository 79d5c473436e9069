"""``ethtool -S`` / ``ethtool -i`` / ``ethtool <if>`` text, and each statistic's vendor-neutral name.

The per-driver name tables live in ``fabricd.drivers.ethtool`` (one module per driver); this module
only reads text. ``parse_ethtool_stats`` is what ``fabricd parse ethtool`` prints: every statistic,
mapped or not (an unmapped one keeps its raw name, ``name`` None), its value in the neutral name's
base unit (microseconds of pause become seconds), and the ``priority`` label.

Accepted shapes (real captures): with or without the ``NIC statistics:`` header and indentation, a
leading ``# ethtool -S eth0`` comment or shell prompt (``[root@host: ~]# sudo ethtool -S em1|grep rx``:
a prompt with spaces, ``sudo``, a pipe with or without spaces; several commands in one paste, and the
bare prompt left on the last line, are fine), names with
spaces or dots (``duplicate metric``, ``port.rx_dropped``), ``ethtool -i`` lines in the same file
(they name the driver), stray ``netlink error:`` lines. ``ERROR: <errno>`` alone is a driver refusal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fabricd.drivers.ethtool import neutral
from fabricd.ethtool_ioctl import DriverInfo, LinkSettings
from fabricd.parsers.common import Problem, problem


class EthtoolReadError(Exception):
    """The driver refused the request (``ERROR: 1`` in a capture, an errno from the ioctl)."""


_ERROR = re.compile(r"ERROR:\s*(\d{1,20})\s*")
# Names end before any blanks ahead of the colon: cxgb4 pads its strings to align the columns
# (kernel commit 0bf9a7d6174f, "cxgb4: Align rest of the ethtool get stats", v4.5).
_STAT_LINE = re.compile(r"\s*(?P<name>\S.*?)\s*:\s+(?P<value>\d{1,20})\s*")
# A shell prompt as pasted with a capture: ``#``, ``$``, ``user@host:~$``, or a bracketed one with a
# space in it, ``[root@xg-esm-data-2: ~]#`` (moooofly/MarkSomethingDown "Linux/ethtool 工具使用.md").
_PROMPT = r"(?:\[[^\]]*\]|\S*)[$#%>]"
# The interface ends at a pipe written without a space (``ethtool -S em1|grep tx_queue``, same file);
# ``sudo`` may come before ``ethtool``; a command pasted without its prompt counts too. Any ethtool
# command is a command line: one paste may hold ``$ ethtool -i eth0`` and its output before
# ``$ ethtool -S eth0`` (isc-projects/ethq#7, be2net); only ``-S`` names the statistics' interface.
_COMMAND = re.compile(
    rf"(?:{_PROMPT})?\s*(?:sudo\s+)?ethtool(?:\s+(?P<option>-{{1,2}}[\w-]+))?\s+(?P<ifname>[^\s|;>]+)"
)
_STATISTICS = frozenset({"-S", "--statistics"})
# The prompt left alone on the last line of a pasted session (``[root@xg-esm-data-2: ~]#``).
_BARE_PROMPT = re.compile(_PROMPT)
# Another command at a prompt: a ``grep`` or ``cat`` of the dump sosreport saved, which names the
# interface in its file name (``$ grep pause sos_commands/networking/ethtool_-S_eth1``, ryran/xsos#112).
_PROMPTED = re.compile(rf"{_PROMPT}\s+\S.*")
_SOSREPORT_FILE = re.compile(r"ethtool_-S_(?P<ifname>[\w.:@-]+)")
# grep over several saved dumps prefixes each line with its file (``egrep "drop|err"
# sos_commands/networking/ethtool_-S_eth*``, ryran/xsos#65): ``.../ethtool_-S_eth0:     rx_errors: 5``.
_GREP_PREFIX = re.compile(r"\s*\S*ethtool_-S_(?P<ifname>[\w.@-]+):(?=\s)")
_INFO_KEYS = frozenset(
    {
        "driver",
        "version",
        "firmware-version",
        "expansion-rom-version",
        "bus-info",
        "supports-statistics",
        "supports-test",
        "supports-eeprom-access",
        "supports-register-dump",
        "supports-priv-flags",
    }
)
_HEADERS = ("NIC statistics:", "netlink error:")


@dataclass(frozen=True, slots=True)
class EthtoolStat:
    raw: str
    name: str | None  # vendor-neutral name; None when no driver table knows the statistic
    labels: dict[str, str]
    value: float | int  # in the neutral name's base unit (the raw count when unmapped)
    unit: str


@dataclass(frozen=True, slots=True)
class EthtoolResult:
    driver: str | None
    interface: str | None
    stats: list[EthtoolStat] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def parse_ethtool_s(text: str) -> dict[str, int]:
    """``ethtool -S`` text -> {raw statistic name: value}; the first occurrence of a repeated name
    wins. A capture that is only ``ERROR: <errno>`` (no newline) raises ``EthtoolReadError``."""
    error = _ERROR.fullmatch(text)
    if error:
        raise EthtoolReadError(f"driver returned error {error.group(1)}")
    stats: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = _STAT_LINE.fullmatch(line)
        if match and match["name"].lower() not in _INFO_KEYS:  # ``ethtool -i`` pasted before it
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
    speed = re.fullmatch(r"(\d{1,20})Mb/s", kv.get("speed", ""))
    link = kv.get("link detected")
    return LinkSettings(
        speed_mbps=int(speed.group(1)) if speed else None,
        duplex=kv.get("duplex", "").lower() or None,
        link_detected=None if link is None else link == "yes",
    )


def stat(raw: str, value: int, driver: str = "") -> EthtoolStat:
    """One statistic under its neutral name (the given driver's table, else every table's)."""
    found = neutral(raw, driver)
    if found is None:
        return EthtoolStat(raw, None, {}, value, "")
    labels = {"priority": found.priority} if found.priority else {}
    converted = found.convert(value)
    return EthtoolStat(raw, found.name, labels, int(converted) if converted.is_integer() else converted, found.unit)


def _ignored(stripped: str) -> bool:
    """Blank lines, comments, headers, ``ethtool -i`` lines and a bare shell prompt."""
    if not stripped or stripped.startswith(("#", *_HEADERS)) or _BARE_PROMPT.fullmatch(stripped):
        return True
    return stripped.split(":")[0].lower() in _INFO_KEYS


def parse_ethtool_stats(text: str, driver: str | None = None) -> EthtoolResult:
    """Every statistic of an ``ethtool -S`` capture, in text order; lines that are neither a
    statistic, a header, a command line nor an ``ethtool -i`` line are problems."""
    if error := _ERROR.fullmatch(text.strip()):
        return EthtoolResult(driver, None, [], [problem(1, f"driver returned error {error.group(1)}", text)])
    interface, stats, problems, seen = None, [], [], set()
    info = _key_values("\n".join(line for line in text.splitlines() if not _STAT_LINE.fullmatch(line)))
    driver = driver or info.get("driver") or None
    for number, line in enumerate(text.splitlines(), 1):
        if prefix := _GREP_PREFIX.match(line):  # one interface's statistics per result
            interface = interface or prefix["ifname"]
            if prefix["ifname"] != interface:
                problems.append(
                    problem(
                        number,
                        f"a statistic of another interface ({prefix['ifname']}): give each interface's dump a file of its own",
                        line.strip(),
                    )
                )
                continue
            line = line[prefix.end() :]
        stripped = line.strip()
        if m := _COMMAND.match(stripped):
            interface = interface or (m["ifname"] if m["option"] in _STATISTICS else None)
        elif (m := _STAT_LINE.fullmatch(line)) and m["name"].lower() not in _INFO_KEYS:
            if m["name"] not in seen:  # a repeated name: the first one wins, as the collector does
                seen.add(m["name"])
                stats.append(stat(m["name"], int(m["value"]), driver or ""))
        elif _ignored(stripped):
            continue
        elif _PROMPTED.fullmatch(stripped):
            saved = _SOSREPORT_FILE.search(stripped)
            interface = interface or (saved["ifname"] if saved else None)
        else:
            problems.append(problem(number, "not an ethtool 'name: value' statistic", stripped))
    if not stats:
        problems.append(problem(0, "no ethtool statistics in the text"))
    return EthtoolResult(driver, interface, stats, problems)
