"""What one catalogue row says (``fabricd.catalogue``), and the helpers the row tables are written with."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # as exposed; a regex when ``pattern``
    type: str  # counter | gauge | histogram
    unit: str  # base unit ("" for counts and levels)
    help: str
    labels: tuple[str, ...]  # on every series
    optional: tuple[str, ...] = ()  # on some series only
    pattern: bool = False

    def matches(self, name: str) -> bool:
        return re.fullmatch(self.name, name) is not None if self.pattern else name == self.name


def counter(
    name: str, unit: str, help: str, labels: tuple[str, ...], optional: tuple[str, ...] = (), pattern: bool = False
) -> tuple[MetricSpec, MetricSpec]:
    rate_unit = f"{unit}/s" if unit else "1/s"
    rate_help = f"Per-second rate (agent-computed): {help[0].lower()}{help[1:]}"
    return (
        MetricSpec(f"{name}_total", "counter", unit, help, labels, optional, pattern),
        MetricSpec(f"{name}_per_second", "gauge", rate_unit, rate_help, labels, optional, pattern),
    )


def gauge(
    name: str, unit: str, help: str, labels: tuple[str, ...], optional: tuple[str, ...] = ()
) -> tuple[MetricSpec]:
    return (MetricSpec(name, "gauge", unit, help, labels, optional),)


def rows(*groups: tuple[MetricSpec, ...]) -> tuple[MetricSpec, ...]:
    return tuple(spec for group in groups for spec in group)
