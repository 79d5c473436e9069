"""Declarative detection rules (``rules/detection/*.yaml``), loaded and validated at start.

A rule says: when ``signal`` meets ``condition`` (after averaging over ``window``) continuously for
``for``, raise an incident finding of ``kind`` at ``severity`` (``critical`` when the value also
meets the ``critical`` level). Once firing, the rule keeps firing until the value no longer meets
the ``clear`` level (hysteresis, so a value hovering at the threshold does not flap).

Errors name the file and the key (``congestion.yaml: rules[2].condition: ...``) so a bad rule is
found at load, never mid-detection. The engine's lifecycle settings (quiet period, reopen window,
flap damping) live under ``lifecycle:`` and detector parameters under ``params:``.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fabricd.model import IncidentKind, Severity

RULES_DIR = Path(__file__).resolve().parent.parent.parent / "rules" / "detection"

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
_CONDITION = re.compile(r"^\s*(>=|<=|>|<)\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(%?)\s*$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_RULE_KEYS = frozenset(
    {"name", "kind", "signal", "condition", "window", "for", "severity", "critical", "clear", "description"}
)


class RuleError(ValueError):
    """A rule file is invalid; the message names the file and the key."""

    def __init__(self, source: str, key: str, message: str) -> None:
        super().__init__(f"{source}: {key}: {message}")
        self.source = source
        self.key = key


@dataclass(frozen=True, slots=True)
class Condition:
    op: str
    threshold: float

    def holds(self, value: float) -> bool:
        return _OPS[self.op](value, self.threshold)

    def __str__(self) -> str:
        return f"{self.op} {self.threshold:g}"


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    kind: IncidentKind
    signal: str
    condition: Condition
    for_seconds: float = 0.0
    window_seconds: float = 0.0
    severity: Severity = Severity.WARNING
    critical: Condition | None = None
    clear: Condition | None = None  # hysteresis level; defaults to the condition itself
    description: str = ""
    source: str = ""  # file the rule came from, for messages

    def still_holds(self, value: float) -> bool:
        """Once firing: true until the value meets the ``clear`` level (or stops meeting the condition)."""
        if self.clear is None:
            return self.condition.holds(value)
        return not self.clear.holds(value)

    def severity_of(self, value: float) -> Severity:
        if self.critical is not None and self.critical.holds(value):
            return Severity.CRITICAL
        return self.severity


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """Incident lifecycle settings (event time, seconds)."""

    quiet_seconds: float = 60.0  # resolve after this long with no firing finding
    reopen_seconds: float = 600.0  # a recurrence within this window reopens the same incident
    flap_count: int = 3  # this many reopens within flap_window ...
    flap_window_seconds: float = 1800.0
    flap_hold_seconds: float = 600.0  # ... keep the incident open this long after its last firing
    stale_seconds: float = 60.0  # a finding with no fresh observation for this long is dropped


@dataclass(slots=True)
class RuleSet:
    rules: list[Rule] = field(default_factory=list)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    params: dict[str, float] = field(default_factory=dict)

    def param(self, name: str, default: float) -> float:
        return self.params.get(name, default)


def parse_duration(value: Any, source: str, key: str) -> float:
    """``10s``, ``5m``, ``1h``, ``250ms`` or a number of seconds (>= 0)."""
    if isinstance(value, bool):
        raise RuleError(source, key, f"{value!r} is not a duration (use 10s, 5m, 1h)")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise RuleError(source, key, f"{value!r} is not a duration (use 10s, 5m, 1h)")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"]
    if seconds < 0:
        raise RuleError(source, key, "must not be negative")
    return seconds


def parse_condition(value: Any, source: str, key: str) -> Condition:
    """``"> 0.05"``, ``">= 5%"`` (percent becomes a fraction) -> Condition."""
    match = _CONDITION.match(str(value))
    if not match:
        raise RuleError(source, key, f"{value!r} is not a condition (use '> 0.05', '>= 5%', '< 0.5')")
    threshold = float(match.group(2)) / (100.0 if match.group(3) else 1.0)
    return Condition(match.group(1), threshold)


def _enum(cls: type[IncidentKind] | type[Severity], value: Any, source: str, key: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise RuleError(source, key, f"{value!r} is not one of: {allowed}") from None


def parse_rule(raw: Any, source: str, key: str, signals: Iterable[str] | None = None) -> Rule:
    if not isinstance(raw, Mapping):
        raise RuleError(source, key, "each rule must be a mapping")
    unknown = sorted(set(raw) - _RULE_KEYS)
    if unknown:
        raise RuleError(source, f"{key}.{unknown[0]}", f"unknown key (allowed: {', '.join(sorted(_RULE_KEYS))})")
    for required in ("name", "kind", "signal", "condition"):
        if required not in raw:
            raise RuleError(source, f"{key}.{required}", "is required")
    known = set(signals) if signals is not None else None
    if known is not None and raw["signal"] not in known:
        raise RuleError(
            source, f"{key}.signal", f"unknown signal {raw['signal']!r} (known: {', '.join(sorted(known))})"
        )
    return Rule(
        name=str(raw["name"]),
        kind=_enum(IncidentKind, raw["kind"], source, f"{key}.kind"),
        signal=str(raw["signal"]),
        condition=parse_condition(raw["condition"], source, f"{key}.condition"),
        for_seconds=parse_duration(raw.get("for", 0), source, f"{key}.for"),
        window_seconds=parse_duration(raw.get("window", 0), source, f"{key}.window"),
        severity=_enum(Severity, raw.get("severity", "warning"), source, f"{key}.severity"),
        critical=parse_condition(raw["critical"], source, f"{key}.critical") if "critical" in raw else None,
        clear=parse_condition(raw["clear"], source, f"{key}.clear") if "clear" in raw else None,
        description=str(raw.get("description", "")),
        source=source,
    )


def _lifecycle(raw: Any, source: str) -> Lifecycle:
    if not isinstance(raw, Mapping):
        raise RuleError(source, "lifecycle", "must be a mapping")
    fields = {
        "quiet": "quiet_seconds",
        "reopen_window": "reopen_seconds",
        "flap_window": "flap_window_seconds",
        "flap_hold": "flap_hold_seconds",
        "stale": "stale_seconds",
    }
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "flap_count":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RuleError(source, "lifecycle.flap_count", "must be a positive integer")
            out["flap_count"] = value
        elif key in fields:
            out[fields[key]] = parse_duration(value, source, f"lifecycle.{key}")
        else:
            raise RuleError(source, f"lifecycle.{key}", f"unknown key (allowed: flap_count, {', '.join(fields)})")
    return Lifecycle(**out)


def _params(raw: Any, source: str) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        raise RuleError(source, "params", "must be a mapping of name: number")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, bool):
            raise RuleError(source, f"params.{key}", "must be a number or a duration")
        is_number = isinstance(value, int | float)
        out[str(key)] = float(value) if is_number else parse_duration(value, source, f"params.{key}")
    return out


def parse_document(doc: Any, source: str, signals: Iterable[str] | None = None) -> RuleSet:
    """One YAML document -> RuleSet (top-level keys: ``rules``, ``lifecycle``, ``params``)."""
    if doc is None:
        return RuleSet()
    if not isinstance(doc, Mapping):
        raise RuleError(source, "(top level)", "must be a mapping with rules/lifecycle/params")
    extra = sorted(set(doc) - {"rules", "lifecycle", "params"})
    if extra:
        raise RuleError(source, str(extra[0]), "unknown top-level key (allowed: rules, lifecycle, params)")
    raw_rules = doc.get("rules") or []
    if not isinstance(raw_rules, list):
        raise RuleError(source, "rules", "must be a list")
    sig = list(signals) if signals is not None else None
    rules = [parse_rule(r, source, f"rules[{i}]", sig) for i, r in enumerate(raw_rules)]
    lifecycle = _lifecycle(doc["lifecycle"], source) if "lifecycle" in doc else Lifecycle()
    params = _params(doc["params"], source) if "params" in doc else {}
    return RuleSet(rules, lifecycle, params)


def load_rules(paths: Iterable[Path] | None = None, signals: Iterable[str] | None = None) -> RuleSet:
    """Load every ``*.yaml`` under the given files/folders (default: the shipped ``rules/detection``)."""
    files = _yaml_files(paths if paths is not None else [RULES_DIR])
    merged = RuleSet()
    names: dict[str, str] = {}
    sig = list(signals) if signals is not None else None
    for path in files:
        try:
            doc = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise RuleError(path.name, "(syntax)", str(exc).replace("\n", " ")) from None
        part = parse_document(doc, path.name, sig)
        for i, rule in enumerate(part.rules):
            if rule.name in names:
                raise RuleError(
                    path.name, f"rules[{i}].name", f"duplicate rule name {rule.name!r} (also in {names[rule.name]})"
                )
            names[rule.name] = path.name
        merged.rules.extend(part.rules)
        merged.params.update(part.params)
        if doc and "lifecycle" in doc:
            merged.lifecycle = part.lifecycle
    return merged


def _yaml_files(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out.extend(sorted(p for p in path.iterdir() if p.suffix in {".yaml", ".yml"}))
        else:
            out.append(path)
    return out
