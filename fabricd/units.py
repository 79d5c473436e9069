"""How every view shows a number with its unit: the CLI tables, the HTML reports, the demo banner.

One convention, so an engineer comparing ``fabricd ports`` with a report never converts in their
head: port throughput in bits per second with SI prefixes (``12.3 Gb/s``), the unit link rates are
sold and named in ("400 Gb/sec (4X NDR)" in sysfs); every other rate as ``<value> <unit>/s``
(``11.4k ticks/s``, ``3 errors/s``); fractions as percentages. Values arrive in base units
(bytes/s, ticks/s; docs/counters.md). NCCL-tests bus bandwidth stays in GB/s (bytes, G = 1e9) in
its own tables, as nccl-tests prints it, and says so in its column header.
"""

from __future__ import annotations

PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
BITS_PER_BYTE = 8.0


def si(value: float | None, unit: str = "", digits: int = 3) -> str:
    """``value`` with an SI prefix and ``digits`` significant digits: ``si(11400, "ticks/s")`` -> ``11.4k ticks/s``."""
    if value is None:
        return "-"
    for scale, prefix in PREFIXES:
        if abs(value) >= scale:
            return _join(f"{value / scale:.{digits}g}{prefix}", unit)
    return _join(f"{value:.{digits}g}", unit)


def _join(number: str, unit: str) -> str:
    # "11.4k ticks/s": a space before a word; prefix and symbol together ("12.3 Gb/s" is si's job).
    return f"{number} {unit}" if unit else number


def throughput(bytes_per_second: float | None, digits: int = 3) -> str:
    """Port throughput as bits per second: ``throughput(1.5e9)`` -> ``12 Gb/s``."""
    if bytes_per_second is None:
        return "-"
    bits = bytes_per_second * BITS_PER_BYTE
    for scale, prefix in PREFIXES:
        if abs(bits) >= scale:
            return f"{bits / scale:.{digits}g} {prefix}b/s"
    return f"{bits:.{digits}g} b/s"


def rate(value: float | None, unit: str, digits: int = 3) -> str:
    """Any other per-second rate, unit spelled out: ``rate(11400, "ticks")`` -> ``11.4k ticks/s``."""
    return si(value, f"{unit}/s", digits)


def percent(fraction: float | None, digits: int = 1) -> str:
    """A fraction of 1 as a percentage: ``percent(0.123)`` -> ``12.3%``."""
    return "-" if fraction is None else f"{fraction * 100:.{digits}f}%"


def count(n: int, noun: str) -> str:
    """``count(1, "node pair")`` -> ``1 node pair``; ``count(2, "node pair")`` -> ``2 node pairs``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# How a signal-table unit (``fabricd.signal_table.Signal.unit``) reads after a number.
_SIGNAL_UNITS = {
    "packets_per_second": "packets/s",
    "errors_per_gigabyte": "errors/GB",
}


def quantity(value: float | None, unit: str) -> str:
    """A signal's value in its table unit: ``ratio`` as a percentage (``14.6%``), bytes/s as Gb/s,
    bytes with an SI prefix (``120 kB``), ``per_second`` as ``/s`` (``0.5/s``), counts of things per
    second spelled out (``350k packets/s``); a ``score`` (robust z-score) or an unknown unit bare."""
    if value is None:
        return "-"
    if unit == "ratio":
        return f"{value * 100:.3g}%"
    if unit == "bytes_per_second":
        return throughput(value)
    if unit == "bytes":
        return _prefixed(value, "B")
    if unit == "per_second":
        return f"{si(value)}/s"
    if unit in _SIGNAL_UNITS:
        return si(value, _SIGNAL_UNITS[unit])
    return si(value)


def _prefixed(value: float, symbol: str, digits: int = 3) -> str:
    """``_prefixed(120000, "B")`` -> ``120 kB`` (prefix and symbol together, as throughput writes Gb/s)."""
    for scale, prefix in PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}{symbol}"
    return f"{value:.{digits}g} {symbol}"
