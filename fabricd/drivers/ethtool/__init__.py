"""``ethtool -S`` names: one module per NIC driver mapping its statistics to neutral names.

A driver module defines ``DRIVER = EthtoolDriver(...)``: the driver names ``ethtool -i`` reports
(``driver: mlx5_core``), the kernel file its string tables come from, and its rules, each a regex
over the raw name (full match) -> neutral name, unit, divisor to base units and priority label.
``drivers()`` finds the modules (pkgutil): adding a driver is one new module here plus one case
folder under ``tests/cases/ethtool/``. Priorities become a label (``priority="3"``); link-level
(802.3x, non-PFC) pause is ``priority="global"``; a driver's sum over all priorities (ionic
``frames_rx_pripause``) is ``priority="all"``.

``neutral(raw)`` tries every driver's rules (the collector does not pass the driver today), so a
raw name must mean the same in every driver that has it: ``tests/test_drivers.py`` checks that no
two drivers map one example name differently. ``neutral(raw, driver)`` uses only that driver's
rules when it has a module (for names that do mean different things in two drivers).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from fabricd.drivers import discover

MICROSECONDS_PER_SECOND = 1_000_000
P = "{p}"  # priority from the rule's first regex group
US = MICROSECONDS_PER_SECOND


@dataclass(frozen=True, slots=True)
class Neutral:
    """Where one raw statistic lands: neutral name, unit, divisor to base units, priority label."""

    name: str
    unit: str
    divisor: int = 1  # microseconds -> seconds: 1_000_000 (a division keeps 456000 us == 0.456 s exact)
    priority: str | None = None

    @property
    def scale(self) -> float:
        return 1.0 / self.divisor

    def convert(self, raw: int) -> float:
        return raw / self.divisor


@dataclass(frozen=True, slots=True)
class Rule:
    pattern: re.Pattern[str]
    name: str
    unit: str
    divisor: int = 1
    # None: no priority label; "{p}": the first regex group; anything else: that literal label.
    priority: str | None = None

    def apply(self, raw: str) -> Neutral | None:
        match = self.pattern.fullmatch(raw)
        if match is None:
            return None
        priority = match.group(1) if self.priority == P else self.priority
        return Neutral(self.name, self.unit, self.divisor, priority)


def rule(regex: str, name: str, unit: str, divisor: int = 1, priority: str | None = None) -> Rule:
    return Rule(re.compile(regex), name, unit, divisor, priority)


@dataclass(frozen=True)
class EthtoolDriver:
    name: str
    kernel_drivers: tuple[str, ...]  # what ``ethtool -i`` says after ``driver:``
    source: str  # kernel file and string tables the names come from
    rules: tuple[Rule, ...]


@functools.cache
def drivers() -> tuple[EthtoolDriver, ...]:
    """Every driver module of this package, by module name."""
    return discover(__name__, __path__, EthtoolDriver)


@functools.cache
def _rules(driver: str) -> tuple[Rule, ...]:
    own = [d.rules for d in drivers() if driver and driver in d.kernel_drivers]
    return own[0] if own else tuple(r for d in drivers() for r in d.rules)


# A NIC has a few hundred statistic names and they do not change between scrapes: memoize the
# regex rules per name (bounded: a driver inventing names cannot grow it past maxsize).
@functools.lru_cache(maxsize=16384)
def neutral(raw: str, driver: str = "") -> Neutral | None:
    """The neutral name for a raw driver statistic, or None when fabricd has none."""
    for r in _rules(driver):
        found = r.apply(raw)
        if found is not None:
            return found
    return None


# Per-queue / per-channel statistics: one series per ring multiplies cardinality by the queue count.
# mlx5 ``rx3_packets``/``ch3_events``; veth, virtio, ice ``rx_queue_0_*``; ionic ``tx_0_pkts``,
# ``rxq_0_napi_*``; i40e ``tx-0.packets``; bnxt ``[0]: rx_ucast_packets``. mlx5's size histograms
# (``rx_64_bytes_phy``) look like ionic queues, hence the ``_phy`` exclusion.
_QUEUE_STATS = re.compile(
    r"(?:rx|tx|ch|xdpsq|xsk)\d+_.*"
    r"|(?:rx|tx)_queue_\d+_.*"
    r"|(?:rx|tx)q?_\d+_(?!.*_phy$).*"
    r"|(?:rx|tx)-\d+\..*"
    r"|\[\d+\]:.*"
)


@functools.lru_cache(maxsize=16384)
def is_queue_stat(raw: str) -> bool:
    return _QUEUE_STATS.fullmatch(raw) is not None


def all_rules() -> tuple[tuple[str, str, str], ...]:
    """(regex, neutral name, unit) of every rule, for docs and the catalogue test."""
    return tuple((r.pattern.pattern, r.name, r.unit) for d in drivers() for r in d.rules)
