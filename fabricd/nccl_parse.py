"""Pure parser for NCCL-tests output (``all_reduce_perf``, ``all_gather_perf``, ``alltoall_perf``, ...).

``parse_nccl_output(text) -> NcclRun``. No I/O: the collector (``collectors/nccl.py``) runs the binary
or tails the log and hands the text here.

The table layout is read from the header line, never assumed, because it changed over the years
(docs/latency.md and ../shared/fixtures/README.md §4):

- leading columns ``size count type [redop] [root]``: all_gather has no ``redop``; alltoall has the
  column but leaves it blank, so its rows have one field fewer than the header; ``root`` arrived with
  nccl-tests 2.x;
- then per placement (out-of-place, in-place) ``time algbw busbw`` and ``#wrong`` (an integer count
  of wrong elements) or, in old versions, ``error`` (a float max error, ``N/A`` without validation).

Units: ``time`` is microseconds and ``algbw``/``busbw`` are GB/s with G = 1e9 (nccl-tests
``common.cu`` divides bytes by 1.0E9), converted here once to seconds and bytes/s.

Open MPI ``--tag-output`` prefixes (``[1,0]<stdout>:``), ``NCCL INFO`` lines, ssh warnings and X11
noise may appear anywhere and are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

# Scaled in decimal so "68.4048" GB/s becomes exactly 68404800000.0, not 68404799999.99999.
GB = Decimal(10) ** 9  # nccl-tests GB/s: bytes / 1.0E9 (common.cu), not GiB
US = Decimal(10) ** -6

PLACEMENTS = ("out_of_place", "in_place")

# Failure reasons, most specific first: the first one found becomes ``NcclRun.reason``.
REASON_CUDA = "cuda_failure"
REASON_NCCL = "nccl_failure"
REASON_ABORTED = "aborted"
REASON_OOB = "out_of_bounds"
REASON_WRONG = "wrong_values"
REASON_TEST_FAILURE = "test_failure"
REASON_INCOMPLETE = "incomplete"
REASON_ORDER = (
    REASON_CUDA,
    REASON_NCCL,
    REASON_ABORTED,
    REASON_OOB,
    REASON_WRONG,
    REASON_TEST_FAILURE,
    REASON_INCOMPLETE,
)

_MPI_TAG = re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>:")
_START = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_VERSION = re.compile(r"^#\s*nccl-tests version\s+(\S+)")
_PARAMS = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)")
_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s+(.*?)\s*$"
)
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_CUDA_FAIL = re.compile(r"Test CUDA failure\s+(.*?)\s*$")
_NCCL_FAIL = re.compile(r"Test NCCL failure\s+(.*?)\s*$")
_TEST_FAIL = re.compile(r"Test failure\s+(.*?)\s*$")
_FAILURE_PATTERNS = ((_CUDA_FAIL, REASON_CUDA), (_NCCL_FAIL, REASON_NCCL), (_TEST_FAIL, REASON_TEST_FAILURE))
_INT = re.compile(r"^-?\d+$")
_OP_NAME = re.compile(r"([a-z_]+?)_perf")


@dataclass(frozen=True, slots=True)
class NcclRow:
    """One (message size, placement) measurement."""

    size_bytes: int
    count: int
    dtype: str
    redop: str | None  # None: no redop column; "": column present but blank (alltoall)
    root: int | None  # None: no root column (old versions)
    placement: str
    time_seconds: float | None
    algbw_bytes_per_second: float | None
    busbw_bytes_per_second: float | None
    wrong: int | None  # #wrong column; None for old ``error`` columns
    error: float | None = None  # old ``error`` column (max error); None when N/A or absent


@dataclass(frozen=True, slots=True)
class NcclRank:
    rank: int
    host: str
    device: int
    bus_id: str
    model: str


@dataclass(frozen=True, slots=True)
class NcclFailure:
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class NcclRun:
    op: str
    rows: tuple[NcclRow, ...]
    version: str = ""
    n_threads: int | None = None
    n_gpus: int | None = None
    ranks: tuple[NcclRank, ...] = ()
    avg_busbw_bytes_per_second: float | None = None
    out_of_bounds: int | None = None
    out_of_bounds_ok: bool | None = None
    failures: tuple[NcclFailure, ...] = ()

    @property
    def success(self) -> bool:
        return not self.failures

    @property
    def reason(self) -> str:
        return self.failures[0].reason if self.failures else ""

    @property
    def detail(self) -> str:
        return self.failures[0].detail if self.failures else ""

    @property
    def nranks(self) -> int | None:
        return len(self.ranks) or None

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "version": self.version,
            "n_threads": self.n_threads,
            "n_gpus": self.n_gpus,
            "nranks": self.nranks,
            "hosts": sorted({r.host for r in self.ranks}),
            "avg_busbw_bytes_per_second": self.avg_busbw_bytes_per_second,
            "out_of_bounds": self.out_of_bounds,
            "out_of_bounds_ok": self.out_of_bounds_ok,
            "success": self.success,
            "reason": self.reason,
            "failures": [{"reason": f.reason, "detail": f.detail} for f in self.failures],
            "rows": [_row_json(r) for r in self.rows],
        }


def _row_json(row: NcclRow) -> dict[str, Any]:
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


def op_from_name(name: str) -> str:
    """``all_reduce_perf_mpi`` or ``/opt/nccl-tests/build/all_gather_perf`` -> the operation name."""
    base = name.rsplit("/", 1)[-1]
    match = _OP_NAME.search(base)
    return match.group(1) if match else ""


@dataclass(frozen=True, slots=True)
class _Layout:
    """Column layout read from the ``#  size  count  type ...`` header line."""

    leading: tuple[str, ...]  # e.g. ("size", "count", "type", "redop", "root")
    per_placement: tuple[str, ...]  # e.g. ("time", "algbw", "busbw", "#wrong")
    placements: int


def _layout_of(line: str) -> _Layout | None:
    tokens = line.lstrip("#").split()
    if tokens[:2] != ["size", "count"] or "time" not in tokens:
        return None
    first = tokens.index("time")
    groups = tokens.count("time")
    per = tokens[first:]
    if groups == 0 or len(per) % groups:
        return None
    return _Layout(tuple(tokens[:first]), tuple(per[: len(per) // groups]), groups)


@dataclass
class _State:
    op: str = ""
    version: str = ""
    n_threads: int | None = None
    n_gpus: int | None = None
    layout: _Layout | None = None
    ranks: list[NcclRank] = field(default_factory=list)
    rows: list[NcclRow] = field(default_factory=list)
    avg: float | None = None
    oob: int | None = None
    oob_ok: bool | None = None
    failures: list[NcclFailure] = field(default_factory=list)


def _number(token: str, scale: Decimal = Decimal(1)) -> float | None:
    try:
        value = Decimal(token)
    except InvalidOperation:
        return None  # "N/A" (validation off) or a garbled cell
    return float(value * scale) if value.is_finite() else None


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


def _placement_row(lead: dict[str, str], names: tuple[str, ...], cells: list[str], where: str) -> NcclRow:
    values = dict(zip(names, cells, strict=True))
    wrong_cell = values.get("#wrong")
    return NcclRow(
        size_bytes=int(lead["size"]),
        count=int(lead["count"]),
        dtype=lead.get("type", ""),
        redop=lead.get("redop"),
        root=int(lead["root"]) if "root" in lead else None,
        placement=where,
        time_seconds=_number(values.get("time", ""), US),
        algbw_bytes_per_second=_number(values.get("algbw", ""), GB),
        busbw_bytes_per_second=_number(values.get("busbw", ""), GB),
        wrong=int(wrong_cell) if wrong_cell is not None and _INT.match(wrong_cell) else None,
        error=_number(values["error"]) if "error" in values else None,
    )


def _parse_row(layout: _Layout, line: str) -> list[NcclRow]:
    tokens = line.split()
    width = len(layout.per_placement) * layout.placements
    if len(tokens) <= width or not _INT.match(tokens[0]):
        return []
    lead = _leading_values(layout.leading, tokens[:-width])
    if lead is None or not _INT.match(lead.get("count", "x")):
        return []
    tail = tokens[-width:]
    step = len(layout.per_placement)
    return [
        _placement_row(lead, layout.per_placement, tail[i * step : (i + 1) * step], PLACEMENTS[i])
        for i in range(min(layout.placements, len(PLACEMENTS)))
    ]


def _header_line(state: _State, line: str) -> None:
    if m := _START.match(line):
        state.op = op_from_name(m.group(1)) or state.op
    elif m := _VERSION.match(line):
        state.version = m.group(1)
    elif m := _PARAMS.match(line):
        state.n_threads, state.n_gpus = int(m.group(1)), int(m.group(2))
    elif m := _RANK.match(line):
        rank, host, device, bus, model = m.groups()
        state.ranks.append(NcclRank(int(rank), host, int(device), bus, model))
    elif m := _OOB.match(line):
        state.oob, state.oob_ok = int(m.group(1)), m.group(2) == "OK"
    elif m := _AVG.match(line):
        state.avg = _number(m.group(1), GB)
    elif (layout := _layout_of(line)) is not None:
        state.layout = layout


def _failure_line(state: _State, line: str) -> None:
    for pattern, reason in _FAILURE_PATTERNS:
        if m := pattern.search(line):
            state.failures.append(NcclFailure(reason, m.group(1)))
            return


def _feed(state: _State, raw: str) -> None:
    line = _MPI_TAG.sub("", raw).strip()
    if not line:
        return
    if line.startswith("#"):
        _header_line(state, line)
    elif state.layout is not None and (rows := _parse_row(state.layout, line)):
        state.rows.extend(rows)
    else:
        _failure_line(state, line)


def _summary_failures(state: _State) -> list[NcclFailure]:
    found: list[NcclFailure] = []
    if not state.rows:
        found.append(NcclFailure(REASON_ABORTED, "no result table"))
    if state.oob_ok is False:
        found.append(NcclFailure(REASON_OOB, f"{state.oob} out-of-bounds values"))
    wrong = sum(r.wrong or 0 for r in state.rows)
    if wrong:
        found.append(NcclFailure(REASON_WRONG, f"{wrong} wrong elements"))
    if state.rows and state.avg is None and state.oob is None:
        # The summary is the last thing nccl-tests prints: without it the run was cut short.
        found.append(NcclFailure(REASON_INCOMPLETE, "no summary after the table"))
    return found


def _dedupe(failures: list[NcclFailure]) -> tuple[NcclFailure, ...]:
    """One entry per (reason, detail), ordered most specific reason first (ranks repeat lines)."""
    unique = list(dict.fromkeys(failures))
    return tuple(sorted(unique, key=lambda f: REASON_ORDER.index(f.reason)))


def parse_nccl_output(text: str, op: str = "") -> NcclRun:
    """Parse one run's output. ``op`` is a fallback (from the command) when the text names none."""
    state = _State(op=op)
    for raw in text.splitlines():
        _feed(state, raw)
    failures = _dedupe(state.failures + _summary_failures(state))
    return NcclRun(
        op=state.op,
        rows=tuple(state.rows),
        version=state.version,
        n_threads=state.n_threads,
        n_gpus=state.n_gpus,
        ranks=tuple(state.ranks),
        avg_busbw_bytes_per_second=state.avg,
        out_of_bounds=state.oob,
        out_of_bounds_ok=state.oob_ok,
        failures=failures,
    )
