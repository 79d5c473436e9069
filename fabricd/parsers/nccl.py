"""NCCL-tests and RCCL-tests output (``all_reduce_perf``, ``all_gather_perf``, ``alltoall_perf``, ...).

``parse_nccl_runs(text, op) -> list[NcclRun]``: one run per header found, so a log holding several
runs (a script running all_reduce, then all_gather, ..., with banners between them) gives each its
own record and op. ``parse_nccl_output`` is the one-run form (the first run). No I/O: the collector
(``collectors/nccl.py``) and ``fabricd parse nccl`` hand the text here.

- Launcher prefixes (``srun --label``, Open MPI ``--tag-output``, pdsh) are stripped per line
  (``fabricd.parsers.launcher``); ``NCCL INFO``/``WARN`` lines, ssh warnings and X11 noise may appear
  anywhere, the table included, and are ignored.
- A run starts at its first header line: ``# nccl-tests version`` / ``# rccl-tests version``,
  ``# Collective test starting:``, or ``# nThread`` (older releases print only that one; old rccl-tests
  ``# nThreads: 1 nGpus: 2 nRanks: 1 ...``, with colons). A header kind seen again, or any header
  after the table began, starts the next run; the header again with only ``#`` lines between is
  another process printing it (an unconnected launch: a failed run, reason ``unconnected``).
- The op: ``# Collective test starting: all_reduce_perf``, a ``*_perf`` word in a command line, prompt
  or banner before the run, else the caller's (file name, ``--op``).
- Versions: the tests' own (``# nccl-tests version 2.18.0 nccl-headers=22907 ...``, ``rccl-tests:
  Version develop:83d38d9``), ``NCCL version 2.25.1+cuda12.8``, RCCL's block (``RCCL version : ...``,
  ``HIP version  : ...``, ``ROCm version : ...``) or one line (``RCCL version 2.17.1+hip5.7 HEAD:...``).
- A failed or cut-short run, or another tool's output (``other_kind``), is a record, never an exception.

The table itself (columns, units, ``-C``/``-I``/``-S``) is ``fabricd.parsers.nccl_table``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from fabricd.parsers import launcher, nccl_table, sniff
from fabricd.parsers.nccl_names import op_from_name, op_in, version_of_code
from fabricd.parsers.nccl_table import GB, PLACEMENTS, Layout, NcclRow, layout_of, looks_like_row, number, parse_row

__all__ = [
    "PLACEMENTS",
    "NcclFailure",
    "NcclRank",
    "NcclRow",
    "NcclRun",
    "op_from_name",
    "parse_nccl_output",
    "parse_nccl_runs",
    "version_of_code",
]

# Failure reasons, most specific first: the first one found becomes ``NcclRun.reason``.
REASON_OTHER_KIND = "other_kind"  # an ncclras report, ethtool -S, ...: fabricd.parsers.sniff
REASON_UNCONNECTED = "unconnected"
REASON_CUDA = "cuda_failure"
REASON_NCCL = "nccl_failure"
REASON_ABORTED = "aborted"
REASON_OOB = "out_of_bounds"
REASON_WRONG = "wrong_values"
REASON_TEST_FAILURE = "test_failure"
REASON_INCOMPLETE = "incomplete"
REASON_ORDER = (
    *(REASON_OTHER_KIND, REASON_UNCONNECTED, REASON_CUDA, REASON_NCCL, REASON_ABORTED),
    *(REASON_OOB, REASON_WRONG, REASON_TEST_FAILURE, REASON_INCOMPLETE),
)
# A run with only these went quiet (killed, out of time, log cut): "truncated", not "failed".
_CUT_SHORT = frozenset({REASON_ABORTED, REASON_INCOMPLETE})

_TESTS_VERSION = re.compile(r"#\s*(?P<tool>\S+)\s+version\s+(?P<version>\S+)(?P<rest>.*)")
_CODES = re.compile(r"(?P<lib>nccl|rccl)-library=(?P<code>\d{1,20})")
_RCCL_TESTS = re.compile(r"rccl-tests:\s*Version\s+(\S+)")
_START = re.compile(r"#\s*Collective test starting:\s*(\S+)")
# Old rccl-tests print colons and the rank count: ``# nThreads: 1 nGpus: 2 nRanks: 1 minBytes: 8 maxBytes: ...``
# (ROCm 5.7, ROCm/rccl#876, LeshengJin 2023-09-16).
_PARAMS = re.compile(
    r"#\s*nThreads?:?\s+(\d{1,20})\s+nGpus:?\s+(\d{1,20})\s+(?:nRanks:?\s+\d{1,20}\s+)?"
    r"minBytes:?\s+(\d{1,20})\s+maxBytes:?\s+(\d{1,20})"
)
_RANK = re.compile(
    r"#\s*Rank\s+(\d{1,20})\s+(?:Group\s+\d{1,20}\s+)?(?:Pid\s+\d{1,20}\s+)?on\s+(\S+)\s+device\s+(\d{1,20})\s+\[([^\]]*)\]\s+(.*?)\s*"
)
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d{1,20})\s+(OK|FAILED)")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(\S+)")
_NCCL_VERSION = re.compile(r"NCCL version\s+(?P<nccl>[\w.]+)(?:\+cuda(?P<cuda>[\d.]+))?")
# NCCL prints its version once per process: bare (``NCCL version 2.25.1+cuda12.8``) under
# NCCL_DEBUG=VERSION/WARN, as an INFO line under NCCL_DEBUG=INFO
# (``GENOA-06:4766:4766 [0] NCCL INFO NCCL version 2.25.1+cuda12.8``, NVIDIA/nccl-tests#287).
_INFO_VERSION = re.compile(r"\bNCCL INFO NCCL version\s")
# RCCL before the ``RCCL version :`` block printed one line: ``RCCL version 2.17.1+hip5.7 HEAD:cbbb3d8+``.
_RCCL_LINE = re.compile(r"(?:.*\bNCCL INFO )?RCCL version\s+(?P<rccl>[\w.]+)(?:\+hip(?P<hip>[\d.]+))?(?:\s.*)?")
_BLOCK = re.compile(r"(?:.*\bNCCL INFO )?(?P<what>RCCL|HIP|ROCm) version\s*:\s*(?P<version>\S+)")
_CUDA_FAIL = re.compile(r"Test CUDA failure\s+(.*?)\s*$")
_NCCL_FAIL = re.compile(r"Test NCCL failure\s+(.*?)\s*$")
_TEST_FAIL = re.compile(r"Test failure\s+(.*?)\s*$")
_FAILURE_PATTERNS = ((_CUDA_FAIL, REASON_CUDA), (_NCCL_FAIL, REASON_NCCL), (_TEST_FAIL, REASON_TEST_FAILURE))
_HEADER_KINDS = {"version": 0, "start": 1, "params": 2}


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
    tool: str = "nccl-tests"
    versions: dict[str, str] = field(default_factory=dict)
    avg_busbw_gbps: float | None = None  # as printed
    skipped_rows: int = 0  # lines that started like a row and did not fit the table

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
    def status(self) -> str:
        if not self.failures:
            return "ok"
        return "truncated" if {f.reason for f in self.failures} <= _CUT_SHORT else "failed"

    @property
    def error(self) -> str | None:
        return f"{self.reason}: {self.detail}" if self.failures else None

    @property
    def nranks(self) -> int | None:
        return len({r.rank for r in self.ranks}) or None  # unconnected copies repeat rank numbers

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
            "rows": [nccl_table.row_json(r) for r in self.rows],
        }


@dataclass
class _State:
    op: str = ""
    version: str = ""
    tool: str = "nccl-tests"
    versions: dict[str, str] = field(default_factory=dict)
    n_threads: int | None = None
    n_gpus: int | None = None
    layout: Layout | None = None
    ranks: list[NcclRank] = field(default_factory=list)
    rows: list[NcclRow] = field(default_factory=list)
    avg: float | None = None
    avg_gbps: float | None = None
    oob: int | None = None
    oob_ok: bool | None = None
    failures: list[NcclFailure] = field(default_factory=list)
    last_header: int = -1
    skipped: int = 0
    copies: int = 1  # processes that each printed this run's header (see _Splitter._is_copy)
    only_headers: bool = True  # no line but "#" lines since the last run header

    @property
    def table_began(self) -> bool:
        return self.layout is not None or bool(self.rows) or self.avg is not None or self.oob is not None


def _header_kind(line: str) -> str | None:
    if (m := _TESTS_VERSION.match(line)) and "tests" in m["tool"]:
        return "version"
    if _START.match(line):
        return "start"
    if _PARAMS.match(line):
        return "params"
    return None


def _header_line(state: _State, line: str) -> None:
    if (m := _TESTS_VERSION.match(line)) and "tests" in m["tool"]:
        _tests_version(state, m)
    elif m := _START.match(line):
        state.op = op_from_name(m.group(1)) or state.op
    elif m := _PARAMS.match(line):
        state.n_threads, state.n_gpus = int(m.group(1)), int(m.group(2))
    elif m := _RANK.fullmatch(line):
        rank, host, device, bus, model = m.groups()
        state.ranks.append(NcclRank(int(rank), host, int(device), bus, model))
    elif m := _OOB.match(line):
        state.oob, state.oob_ok = int(m.group(1)), m.group(2) == "OK"
    elif m := _AVG.match(line):
        state.avg, state.avg_gbps = number(m.group(1), GB), number(m.group(1))
    elif (layout := layout_of(line)) is not None:
        state.layout = layout


def _tests_version(state: _State, m: re.Match[str]) -> None:
    state.tool, state.version = m["tool"], m["version"]
    state.versions["tests"] = m["version"]
    for code in _CODES.finditer(m["rest"]):
        state.versions.setdefault(code["lib"], version_of_code(int(code["code"])))


def _other_line(state: _State, line: str) -> None:
    """Version lines, failure lines; anything else (NCCL INFO, noise) is ignored."""
    if m := _RCCL_TESTS.search(line):
        state.tool, state.version = "rccl-tests", m.group(1)
        state.versions["tests"] = m.group(1)
    elif (m := _RCCL_LINE.fullmatch(line)) and not _BLOCK.fullmatch(line):
        state.tool = "rccl-tests" if state.tool == "nccl-tests" else state.tool
        state.versions["rccl"] = m["rccl"]
        if m["hip"]:
            state.versions["hip"] = m["hip"]
    elif m := _BLOCK.fullmatch(line):
        state.versions[m["what"].lower()] = m["version"]
        if m["what"] == "RCCL":
            state.tool = "rccl-tests" if state.tool == "nccl-tests" else state.tool
    elif (m := _NCCL_VERSION.search(line)) and ("NCCL INFO" not in line or _INFO_VERSION.search(line)):
        state.versions["nccl"] = m["nccl"]
        if m["cuda"]:
            state.versions["cuda"] = m["cuda"]
    else:
        for pattern, reason in _FAILURE_PATTERNS:
            if m := pattern.search(line):
                state.failures.append(NcclFailure(reason, m.group(1)))
                return
        if state.layout is not None and looks_like_row(line):
            state.skipped += 1


def _unconnected(state: _State) -> NcclFailure | None:
    """Processes that did not join one job: each prints the header (``PRINT`` is rank 0's) and its
    own ranks from 0, interleaved (NVIDIA/nccl-tests#213, #306: ``mpirun -np 2`` of a binary built
    without ``MPI=1``, so every process is rank 0 of a job of its own)."""
    numbers = [r.rank for r in state.ranks]
    repeated = sorted({n for n in numbers if numbers.count(n) > 1})
    if state.copies < 2 and not repeated:
        return None
    copies = max([state.copies] + [numbers.count(n) for n in repeated])
    where = f"; rank {repeated[0]} is listed {numbers.count(repeated[0])} times" if repeated else ""
    return NcclFailure(REASON_UNCONNECTED, f"{copies} processes each printed their own run header{where}")


def _summary_failures(state: _State) -> list[NcclFailure]:
    found: list[NcclFailure] = [f for f in [_unconnected(state)] if f is not None]
    if not state.rows:
        found.append(NcclFailure(REASON_ABORTED, "no result table"))
    if state.oob_ok is False:
        found.append(NcclFailure(REASON_OOB, f"{state.oob} out-of-bounds values"))
    wrong = sum(r.wrong or 0 for r in state.rows)
    if wrong:
        found.append(NcclFailure(REASON_WRONG, f"{wrong} wrong elements"))
    if state.rows and state.avg is None and state.oob is None and not _nccl1(state):
        # The summary is the last thing nccl-tests prints: without it the run was cut short.
        found.append(NcclFailure(REASON_INCOMPLETE, "no summary after the table"))
    return found


def _nccl1(state: _State) -> bool:
    """NCCL 1's own tests (NVIDIA/nccl v1.3.4-1 test/single/*_test.cu) print the 2017 table with no
    parameter line before it and no summary after it: their end is no cut."""
    return state.layout is not None and state.layout.time_ms and state.n_threads is None


def _dedupe(failures: list[NcclFailure]) -> tuple[NcclFailure, ...]:
    """One entry per (reason, detail), ordered most specific reason first (ranks repeat lines)."""
    unique = list(dict.fromkeys(failures))
    return tuple(sorted(unique, key=lambda f: REASON_ORDER.index(f.reason)))


def _finish(state: _State) -> NcclRun:
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
        failures=_dedupe(state.failures + _summary_failures(state)),
        tool=state.tool,
        versions=dict(state.versions),
        avg_busbw_gbps=state.avg_gbps,
        skipped_rows=state.skipped,
    )


class _Splitter:
    """Feeds lines to the current run and starts a new one at the next run's first header."""

    def __init__(self, op: str) -> None:
        self.fallback = op
        self.runs: list[_State] = []
        self.current: _State | None = None
        self.pending_op = ""

    def feed(self, raw: str) -> None:
        line = launcher.rehash(launcher.unprefix(raw).strip())
        if not line:
            return
        kind = _header_kind(line) if line.startswith("#") else None
        if kind is not None and self._is_copy(_HEADER_KINDS[kind]):
            assert self.current is not None
            self.current.copies += 1
        elif kind is not None and self._starts_new_run(_HEADER_KINDS[kind]):
            self._new_run()
        if kind is not None:
            assert self.current is not None
            self.current.last_header, self.current.only_headers = _HEADER_KINDS[kind], True
        if line.startswith("#"):
            if kind is None and (op := op_in(line)):  # a root prompt: "#  ./all_reduce_perf -b 8" (nccl-tests#44)
                self._names(op)
            _header_line(self._run(), line)
            return
        run = self._run()
        run.only_headers = False
        if run.layout is not None and (rows := parse_row(run.layout, line)):
            run.rows.extend(rows)
            return
        if op := op_in(line):  # a banner or command line: it names the run it precedes
            self._names(op)
        _other_line(run, line)

    def _names(self, op: str) -> None:
        run = self._run()
        if run.table_began or run.last_header >= 0:
            self.pending_op = op
        else:
            run.op = run.op or op

    def _is_copy(self, kind: int) -> bool:
        """The header again with nothing but header lines since it: another process printing the
        same run's header, not a new run (an unconnected launch, see ``_unconnected``)."""
        run = self.current
        if run is None or run.table_began or run.ranks or run.failures or not run.only_headers:
            return False
        return kind <= run.last_header

    def _starts_new_run(self, kind: int) -> bool:
        run = self.current
        return run is None or run.table_began or kind <= run.last_header

    def _new_run(self) -> None:
        self.current = _State(op=self.pending_op or self.fallback)
        self.pending_op = ""
        self.runs.append(self.current)

    def _run(self) -> _State:
        if self.current is None:
            self._new_run()
        assert self.current is not None
        return self.current


def parse_nccl_runs(text: str, op: str = "") -> list[NcclRun]:
    """Every run in ``text``; ``op`` is the fallback for runs whose text names none. Text with no
    run at all (empty, noise, another tool's output) is one run: aborted, no result table."""
    splitter = _Splitter(op)
    for raw in text.splitlines():
        splitter.feed(raw)
    states = splitter.runs or [_State(op=op)]
    if len(states) == 1 and states[0].last_header < 0 and (why := sniff.other_kind(text, "nccl")):
        states[0].failures.append(NcclFailure(REASON_OTHER_KIND, why))
    return [_finish(s) for s in states]


def parse_nccl_output(text: str, op: str = "") -> NcclRun:
    """The first run of ``text`` (the collector's one command is one run)."""
    return parse_nccl_runs(text, op)[0]
