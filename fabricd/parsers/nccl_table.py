"""The result table of one NCCL-tests run: its layout, read from the header line, and its rows.

The layout is read, never assumed, because nccl-tests changed it over the years and its options
change it per run (nccl-tests ``src/util.cu`` ``writeResultHeader``, ``writeBenchmarkLinePreamble``,
``writeBenchmarkLineBody``, ``writePerIterReport``, ``writeTimestamp``; docs/latency.md):

- leading columns ``size count type [redop] [root]``: all_gather had no ``redop``; alltoall has the
  column but leaves it blank, so its rows have one field fewer than the header; ``root`` arrived with
  nccl-tests 2.x;
- then per placement (out-of-place, in-place) ``time algbw busbw`` and ``#wrong`` (an integer count
  of wrong elements, ``N/A`` with ``-c 0``) or, in old versions, ``error`` (a float max error);
- ``-C 1`` names the time column ``cputime``; ``-I 1`` adds ``i_min i_max i_p99 i_cv%`` per placement;
  ``-S 1`` adds a trailing ``timestamp`` column whose cells are ``YYYY-MM-DD HH:MM:SS`` (two words).

- the first nccl-tests (2017-08 to 2019-03) and NCCL 1's tests: ``bytes N type op [root] time algbw busbw
  res``, times in milliseconds (read as ``size count type redop [root] ... error``, times in µs).

Units: ``time`` is microseconds and ``algbw``/``busbw`` are GB/s with G = 1e9 (nccl-tests divides
bytes by 1.0E9), converted once, in decimal, to seconds and bytes/s; the text values are kept too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

GB = Decimal(10) ** 9  # nccl-tests GB/s: bytes / 1.0E9 (common.cu), not GiB
US = Decimal(10) ** -6
PLACEMENTS = ("out_of_place", "in_place")
TIME_COLUMNS = ("time", "cputime")

MS = Decimal(10) ** -3
# The first nccl-tests (NVIDIA/nccl-tests b188a15 2017-08 to dcf8189 2018-08, src/*.cu print_header)
# and NCCL 1's own tests (NVIDIA/nccl v1.3.4-1 test/single/*_test.cu) name the columns
# "bytes N type op [root] time algbw busbw res" and print the time in milliseconds
# (``elapsedSec * 1.0E3``, "%7.3f"); "res" is the max error, later named "error".
_OLD_NAMES = {"bytes": "size", "N": "count", "op": "redop", "res": "error"}

_INT = re.compile(r"-?\d{1,20}")
_DATE, _CLOCK = re.compile(r"\d{4}-\d\d-\d\d"), re.compile(r"\d\d:\d\d:\d\d")


@dataclass(frozen=True, slots=True)
class NcclRow:
    """One (message size, placement) measurement: values as printed and in base units."""

    size_bytes: int
    count: int
    dtype: str
    redop: str | None  # None: no redop column; "": column present but blank (alltoall)
    root: int | None  # None: no root column (old versions)
    placement: str
    time_seconds: float | None
    algbw_bytes_per_second: float | None
    busbw_bytes_per_second: float | None
    wrong: int | None  # #wrong column; None for N/A or old ``error`` columns
    error: float | None = None  # old ``error`` column (max error); None when N/A or absent
    time_us: float | None = None  # as printed
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None


@dataclass(frozen=True, slots=True)
class Layout:
    """Column layout read from the ``#  size  count  type ...`` header line."""

    leading: tuple[str, ...]  # e.g. ("size", "count", "type", "redop", "root")
    per_placement: tuple[str, ...]  # e.g. ("time", "algbw", "busbw", "#wrong")
    placements: int
    timestamp: bool = False  # -S: a trailing date and time on every row
    time_ms: bool = False  # the "bytes N ..." header of 2017-2018: times in milliseconds


def layout_of(line: str) -> Layout | None:
    tokens = line.lstrip("#").split()
    timestamp = bool(tokens) and tokens[-1] == "timestamp"
    if timestamp:
        tokens = tokens[:-1]
    time_ms = tokens[:2] == ["bytes", "N"]
    tokens = [_OLD_NAMES.get(t, t) for t in tokens] if time_ms else tokens
    if tokens[:2] != ["size", "count"]:
        return None
    starts = [i for i, t in enumerate(tokens) if t in TIME_COLUMNS]
    if not starts:
        return None
    first, groups = starts[0], len(starts)
    per = tokens[first:]
    if len(per) % groups:
        return None
    return Layout(tuple(tokens[:first]), tuple(per[: len(per) // groups]), groups, timestamp, time_ms)


def number(token: str, scale: Decimal = Decimal(1)) -> float | None:
    try:
        value = Decimal(token)
    except InvalidOperation:
        return None  # "N/A" (validation off) or a garbled cell
    out = float(value * scale) if value.is_finite() else math.inf
    return out if math.isfinite(out) else None  # "1e400" is no bandwidth (and no JSON number)


def _leading_values(names: tuple[str, ...], tokens: list[str]) -> dict[str, str] | None:
    """Map leading tokens to column names; a blank ``redop`` cell removes one token (alltoall)."""
    if len(tokens) == len(names):
        return dict(zip(names, tokens, strict=True))
    if len(tokens) == len(names) - 1 and "redop" in names:
        without = tuple(n for n in names if n != "redop")
        values = dict(zip(without, tokens, strict=True))
        values["redop"] = ""
        return values
    return None


def _placement_row(lead: dict[str, str], layout: Layout, cells: list[str], where: str) -> NcclRow:
    values = dict(zip(layout.per_placement, cells, strict=True))
    time_cell = values.get("time", values.get("cputime", ""))
    unit = MS if layout.time_ms else US
    wrong_cell = values.get("#wrong")
    return NcclRow(
        size_bytes=int(lead["size"]),
        count=int(lead["count"]),
        dtype=lead.get("type", ""),
        redop=lead.get("redop"),
        root=int(lead["root"]) if "root" in lead and _INT.fullmatch(lead["root"]) else None,
        placement=where,
        time_seconds=number(time_cell, unit),
        algbw_bytes_per_second=number(values.get("algbw", ""), GB),
        busbw_bytes_per_second=number(values.get("busbw", ""), GB),
        wrong=int(wrong_cell) if wrong_cell is not None and _INT.fullmatch(wrong_cell) else None,
        error=number(values["error"]) if "error" in values else None,
        time_us=number(time_cell, unit / US),  # microseconds, whatever the text printed
        algbw_gbps=number(values.get("algbw", "")),
        busbw_gbps=number(values.get("busbw", "")),
    )


def parse_row(layout: Layout, line: str) -> list[NcclRow]:
    """The placements of one table line; [] when the line is not a row of this table."""
    tokens = line.split()
    if layout.timestamp and len(tokens) >= 2 and _DATE.fullmatch(tokens[-2]) and _CLOCK.fullmatch(tokens[-1]):
        tokens = tokens[:-2]
    width = len(layout.per_placement) * layout.placements
    if len(tokens) <= width or not _INT.fullmatch(tokens[0]):
        return []
    lead = _leading_values(layout.leading, tokens[:-width])
    if lead is None or not _INT.fullmatch(lead.get("count", "x")) or not _INT.fullmatch(lead.get("size", "x")):
        return []
    tail = tokens[-width:]
    step = len(layout.per_placement)
    return [
        _placement_row(lead, layout, tail[i * step : (i + 1) * step], PLACEMENTS[i])
        for i in range(min(layout.placements, len(PLACEMENTS)))
    ]


def row_json(row: NcclRow) -> dict[str, Any]:
    """One row as the ``NcclRun.to_json`` record (base units)."""
    return {
        "size_bytes": row.size_bytes,
        "count": row.count,
        "dtype": row.dtype,
        "redop": row.redop,
        "root": row.root,
        "placement": row.placement,
        "time_seconds": row.time_seconds,
        "algbw_bytes_per_second": row.algbw_bytes_per_second,
        "busbw_bytes_per_second": row.busbw_bytes_per_second,
        "wrong": row.wrong,
        "error": row.error,
    }


def looks_like_row(line: str) -> bool:
    """A line that starts like a table row (size and count): a broken one is worth reporting."""
    tokens = line.split()
    return len(tokens) >= 3 and bool(_INT.fullmatch(tokens[0])) and bool(_INT.fullmatch(tokens[1]))
