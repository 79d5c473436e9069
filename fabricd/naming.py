"""Prometheus names of fabricd's series: ``fabricd_<source>_<name>[_<unit>]`` (exposition, catalogue).

One function turns a reading's source, name and unit into its family name, so the exposition, the
metric catalogue (``fabricd.catalogue``) and the dashboard generator (``grafana/generate.py``) agree
on every name. Conventions: https://prometheus.io/docs/practices/naming/.
"""

from __future__ import annotations

import re

_BAD = re.compile(r"[^a-zA-Z0-9_]")
# Reading units -> the unit suffix the name carries. Only measurement units get one (base units,
# and XmitWait's hardware ticks); counts of things (packets, frames, events, probes) do not: the
# name already says what is counted (``rx_pause_frames_total``, node_exporter's ``receive_errs_total``).
UNIT_SUFFIX: dict[str, str] = {
    "bytes": "bytes",
    "seconds": "seconds",
    "ratio": "ratio",
    "ticks": "ticks",
    "bytes_per_second": "bytes_per_second",
    "bytes/s": "bytes_per_second",
}


def sanitize(name: str) -> str:
    name = _BAD.sub("_", name).strip("_").lower()
    return f"_{name}" if name[:1].isdigit() else name


# Words of raw hardware names (ethtool ``rx_corrected_bits_phy``, ``*_us``) that Prometheus's linter
# (``promtool check metrics``) rejects as non-base or abbreviated units or as type names.
_LINT_WORDS: dict[str, str] = {
    "bits": "bit",
    "kilobytes": "kbyte",
    "megabytes": "mbyte",
    "gigabytes": "gbyte",
    "terabytes": "tbyte",
    "milliseconds": "msec",
    "microseconds": "usec",
    "nanoseconds": "nsec",
    "minutes": "minute",
    "hours": "hour",
    "days": "day",
    "s": "secs",
    "sec": "secs",
    "ms": "msec",
    "us": "usec",
    "ns": "nsec",
    "b": "byte",
    "kb": "kbyte",
    "mb": "mbyte",
    "gb": "gbyte",
    "tb": "tbyte",
    "pb": "pbyte",
    "m": "mx",
    "h": "hx",
    "d": "dx",
    "counter": "cntr",
    "gauge": "gge",
    "histogram": "hist",
    "summary": "summ",
    "untyped": "untyp",
}


def lint_safe(name: str) -> str:
    return "_".join(_LINT_WORDS.get(word, word) for word in name.split("_"))


def metric_stem(source: str, name: str, unit: str) -> str:
    """``fabricd_<source>_<name>[_<unit>]`` without the type suffix."""
    stem = f"fabricd_{sanitize(source)}_{lint_safe(sanitize(name))}"
    suffix = UNIT_SUFFIX.get(unit.strip().lower(), "")
    if suffix and not stem.endswith(f"_{suffix}"):
        stem = f"{stem}_{suffix}"
    return stem
