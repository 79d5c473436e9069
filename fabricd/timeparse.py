"""Time parameters for the REST API and the CLI: RFC 3339, relative offsets, ``now``, epoch seconds.

    2026-11-29T15:05:00Z   2026-11-29T16:05:00+01:00   -15m   -2h   -30s   -1d   now   1764428700

Relative offsets are taken back from ``now`` (the caller passes it, so tests are deterministic).
Errors are ``ValueError`` with a message an on-call engineer can act on.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

_RELATIVE = re.compile(r"^-\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
HELP = "use RFC 3339 (2026-11-29T15:05:00Z), a relative offset (-15m, -2h, -1d), 'now' or epoch seconds"


def parse_time(value: str, now: float) -> float:
    """Seconds since the epoch for ``value``; ``now`` anchors relative offsets."""
    text = value.strip()
    if text.lower() == "now":
        return now
    rel = _RELATIVE.match(text.lower())
    if rel:
        return now - float(rel.group(1)) * _UNIT_SECONDS[rel.group(2)]
    number = _epoch(text)
    if number is not None:
        return number
    return _rfc3339(text)


def _epoch(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{text!r} is not a valid time: {HELP}")
    return number


def _rfc3339(text: str) -> float:
    try:
        parsed = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise ValueError(f"{text!r} is not a valid time: {HELP}") from None
    if parsed.tzinfo is None:
        # RFC 3339 requires an offset; a bare local time is ambiguous across a fleet, read it as UTC.
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def parse_duration(value: str) -> float:
    """``30s``, ``5m``, ``1h`` or plain seconds -> seconds (> 0)."""
    text = value.strip().lower()
    match = re.match(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?$", text)
    if not match:
        raise ValueError(f"{value!r} is not a duration: use seconds or 30s, 5m, 1h, 1d")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"]
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than zero")
    return seconds


def iso(ts: float | None) -> str:
    """Seconds since the epoch -> RFC 3339 in UTC (``-`` for none), for tables and logs."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
