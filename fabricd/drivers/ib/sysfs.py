"""What the kernel's InfiniBand sysfs files say (kernel ABI ``sysfs-class-infiniband``): pure functions.

The infiniband collector (``collectors/infiniband.py``) does the I/O; here are the parsers of the
attribute files and the table lookup for each counter file (tables: ``pma.py`` and the drivers).
"""

from __future__ import annotations

import functools

from fabricd.drivers import ib
from fabricd.drivers.ib import Counter, pma

GBIT_BYTES_PER_SECOND = 125_000_000  # 1 Gb/s = 125,000,000 bytes/s (procfs class_infiniband.go does the same)


# --- counter semantics per sysfs file (the tables: fabricd/drivers/ib/) ---------------------------


@functools.lru_cache(maxsize=4096)  # pure; asked again for every file at every re-discovery
def counter_spec(folder: str, counter: str, *, legacy: bool, driver: str) -> Counter | None:
    """The table row for ``<folder>/<counter>`` of a device whose driver table is ``driver`` (``""``
    when none claims it); ``None`` for files that are not counters (``hw_counters/lifespan``)."""
    if folder == "hw_counters":
        return ib.hw_counter(driver, counter)
    return pma.counter(folder, counter, legacy_kernel=legacy) or ib.unknown_counter(counter, guess_unit=False)


def effective_width(spec: Counter, raw: int) -> tuple[int, bool]:
    """A value above all ones proves the counter is wider than its spec (seen in edited fixtures)."""
    if 0 < spec.width < 64 and raw >> spec.width:
        return 64, False
    return spec.width, spec.saturates


# --- pure parsers -------------------------------------------------------------------------------


def parse_value(data: bytes | str) -> int | None:
    """A counter file's value; ``None`` for ``N/A (no PMA)`` (iWARP), empty or garbled content."""
    try:
        value = int(data)  # strips surrounding whitespace (no trailing newline, "\n\n") and accepts bytes
    except ValueError:
        return None
    return value if value >= 0 else None


def parse_state(text: bytes | str) -> tuple[int, str]:
    """``"4: ACTIVE"`` -> ``(4, "ACTIVE")``; ``"5: LinkUp"`` -> ``(5, "LinkUp")``. ValueError if garbled."""
    number, sep, name = text_of(text).partition(":")
    if not sep:
        raise ValueError(f"state without ':': {text!r}")
    return int(number.strip()), name.strip()


def parse_rate(text: bytes | str) -> float:
    """``"400 Gb/sec (4X NDR)"`` -> 5e10 bytes/s (first token in Gb/s x 125,000,000)."""
    first = text_of(text).split(maxsplit=1)
    if not first:
        raise ValueError("empty rate")
    return float(first[0]) * GBIT_BYTES_PER_SECOND


def text_of(data: bytes | str) -> str:
    """An attribute's text: decoded, surrounding whitespace (``InfiniBand\\n\\n``) removed."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text.strip()
