"""NCCL-tests collector: run ``*_perf`` on a schedule (or tail scheduler logs) and report the results.

Two sources, exactly one configured:

- ``command``: an argv such as ``["all_reduce_perf", "-b", "8", "-e", "1G", "-f", "2", "-g", "8"]``,
  possibly wrapped in ``mpirun``/``srun`` (or the simulator: the command is just a command). It runs
  every ``interval_seconds`` with a ``timeout_seconds`` limit, one run at a time: a run still going
  when the next is due is not started a second time, the skip is counted (``runs_skipped``).
- ``log_glob``: files a scheduler writes (``/shared/nccl/*.log``); each file is parsed once, when it
  has not changed for ``settle_seconds``.

``collect()`` never waits for a run: it starts one when due and returns what completed since the
last call. An aborted, failed or timed-out run is a ``Kind.EVENT`` reading (an event, not silence).

Each run also reports the job's shape (``nodes``, ``ranks``) and what the performance model should
assume of it (``model_efficiency`` with an ``algo`` label), so the agent can judge its bus bandwidth
against ``fabricd.perfmodel`` (``fabricd.derived.nccl_efficiency``, docs/model.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import glob
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from fabricd.collector import CollectorContext, CollectorFactories, CollectorOptions
from fabricd.command import CommandResult, CommandRunner, SubprocessRunner
from fabricd.model import Kind, Reading, labels_of
from fabricd.parsers.nccl import NcclRow, NcclRun, op_from_name, parse_nccl_runs
from fabricd.perfmodel import Fabric

SOURCE = "nccl"
DETAIL_MAX = 160  # an event's detail label is bounded: it comes from tool output
FILE_MAX = 128  # the log file's name, as a label: bounded too


class NcclOptions(CollectorOptions):
    command: list[str] | None = Field(default=None, min_length=1)
    interval_seconds: float = Field(default=3600.0, ge=0)
    timeout_seconds: float = Field(default=1800.0, gt=0)
    log_glob: str | None = None
    settle_seconds: float = Field(default=10.0, ge=0)
    # The job's node count when the output names no hosts (no ``#  Rank ... on <host>`` lines).
    nodes: int | None = Field(default=None, ge=1)
    # What the performance model assumes: the algorithm the job uses (NCCL_ALGO) and the achievable
    # fraction of line rate (from ``fabricd model --calibrate``; default: the model's own).
    algo: Literal["ring", "tree"] = "ring"
    model_efficiency: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _one_source(self) -> NcclOptions:
        if (self.command is None) == (self.log_glob is None):
            raise ValueError("set exactly one of command or log_glob")
        return self


@dataclass(frozen=True, slots=True)
class JobModel:
    """What the efficiency model needs of a run beyond its table (the collector's options)."""

    nodes: int | None = None  # used only when the output has no rank lines
    algo: str = "ring"
    efficiency: float = Fabric.efficiency

    @classmethod
    def of(cls, options: NcclOptions) -> JobModel:
        eff = options.model_efficiency if options.model_efficiency is not None else Fabric.efficiency
        return cls(options.nodes, options.algo, eff)


def op_from_command(argv: Sequence[str]) -> str:
    """The collective an argv runs: the first ``*_perf`` word, past any mpirun/srun wrapper."""
    for word in argv:
        if op := op_from_name(word):
            return op
    return ""


MAX_RUN_HOSTS = 128  # a run over more hosts spans the fabric: its hosts cannot tell a victim apart


def host_readings(run: NcclRun, op: str) -> list[Reading]:
    """One info reading per host of the run (from its ``#  Rank N ... on HOST`` lines): the central
    tells a straggler (slow with every partner) from a victim (slow only while its run crosses a
    network fault) by who ran with whom."""
    hosts = sorted({r.host for r in run.ranks})
    if len(hosts) > MAX_RUN_HOSTS:
        return []
    return [
        Reading(SOURCE, op, "", "run_host", 1.0, "", Kind.INFO, labels_of({"host": h}), "run_host_info", 0)
        for h in hosts
    ]


def _gauge(op: str, counter: str, value: float, unit: str, name: str, **labels: str) -> Reading:
    return Reading(
        source=SOURCE,
        device=op,
        port="",
        counter=counter,
        value=value,
        unit=unit,
        kind=Kind.GAUGE,
        labels=labels_of(labels),
        name=name,
        width=0,
    )


def _row_labels(row: NcclRow) -> dict[str, str]:
    labels = {"size": str(row.size_bytes), "placement": row.placement}
    if row.root is not None and row.root >= 0:  # -1 = every rank is root / not applicable
        labels["root"] = str(row.root)
    return labels


def _row_readings(op: str, row: NcclRow) -> list[Reading]:
    labels = labels_of(_row_labels(row))  # once per row: every size of every run goes through here
    values = (
        ("time", row.time_seconds, "seconds", "time_seconds"),
        ("algbw", row.algbw_bytes_per_second, "bytes_per_second", "algbw_bytes_per_second"),
        ("busbw", row.busbw_bytes_per_second, "bytes_per_second", "busbw_bytes_per_second"),
        ("wrong", row.wrong, "elements", "wrong_elements"),
    )
    return [Reading(SOURCE, op, "", c, float(v), u, Kind.GAUGE, labels, n, 0) for c, v, u, n in values if v is not None]


def _latest_rows(run: NcclRun) -> list[NcclRow]:
    # Warm-up sizes repeat (size 0 five times in old versions): one series per key, the last row wins.
    by_key = {tuple(sorted(_row_labels(r).items())): r for r in run.rows}
    return list(by_key.values())


def job_shape(run: NcclRun, nodes_option: int | None) -> tuple[int, int] | None:
    """(nodes, ranks) of the job: distinct hosts and rank lines of the output; without rank lines,
    the configured node count with one process of ``nThread x nGpus`` ranks per node (how a
    per-node ``*_perf -g N`` launch runs). None when neither tells."""
    if run.ranks:
        return len({r.host for r in run.ranks}), len(run.ranks)
    if nodes_option is None or not run.n_gpus:
        return None
    return nodes_option, nodes_option * run.n_gpus * (run.n_threads or 1)


def job_readings(run: NcclRun, op: str, job: JobModel) -> list[Reading]:
    """The job's shape and the model's assumptions, for the agent's efficiency (docs/model.md)."""
    out = [_gauge(op, "model_efficiency", job.efficiency, "ratio", "model_efficiency", algo=job.algo)]
    shape = job_shape(run, job.nodes)
    if shape is not None:
        out.append(_gauge(op, "nodes", float(shape[0]), "", "nodes"))
        out.append(_gauge(op, "ranks", float(shape[1]), "", "ranks"))
    return out


def run_readings(run: NcclRun, op: str, job: JobModel | None = None) -> list[Reading]:
    """Map one parsed run to readings: per size and placement, then per run, then a failure event."""
    out = [reading for row in _latest_rows(run) for reading in _row_readings(op, row)]
    out.extend(job_readings(run, op, job or JobModel()))
    if run.avg_busbw_bytes_per_second is not None:
        out.append(
            _gauge(op, "avg_busbw", run.avg_busbw_bytes_per_second, "bytes_per_second", "avg_busbw_bytes_per_second")
        )
    if run.out_of_bounds is not None:
        out.append(_gauge(op, "out_of_bounds", float(run.out_of_bounds), "values", "out_of_bounds_values"))
    out.append(_gauge(op, "success", 1.0 if run.success else 0.0, "bool", "run_success"))
    out.extend(host_readings(run, op))
    if not run.success:
        out.append(failure_event(op, run.reason, run.detail))
    return out


def failure_event(op: str, reason: str, detail: str) -> Reading:
    labels = labels_of({"reason": reason, "detail": detail[:DETAIL_MAX]})
    return Reading(
        source=SOURCE,
        device=op,
        port="",
        counter="run_failed",
        value=1.0,
        unit="",
        kind=Kind.EVENT,
        labels=labels,
        name="run_failed",
        width=0,
    )


def result_readings(result: CommandResult, op: str, job: JobModel | None = None) -> list[Reading]:
    """A finished command: its parsed output, plus an event when the process itself failed."""
    if result.error:
        return [_gauge(op, "success", 0.0, "bool", "run_success"), failure_event(op, "spawn_error", result.error)]
    if result.timed_out:
        detail = f"killed after {result.duration_seconds:.1f} s"
        return [_gauge(op, "success", 0.0, "bool", "run_success"), failure_event(op, "timeout", detail)]
    runs = parse_nccl_runs(result.output, op=op)  # a wrapper script may run several collectives
    readings = [r for run in runs for r in run_readings(run, run.op or op, job)]
    last = runs[-1]
    if result.returncode != 0 and all(run.success for run in runs):
        readings = [r for r in readings if not (r.counter == "success" and r.device == (last.op or op))]
        readings += [
            _gauge(last.op or op, "success", 0.0, "bool", "run_success"),
            failure_event(last.op or op, "exit_code", f"exit status {result.returncode}"),
        ]
    readings.append(_gauge(last.op or op, "duration", result.duration_seconds, "seconds", "run_duration_seconds"))
    return readings


def with_file(readings: Sequence[Reading], name: str) -> list[Reading]:
    """Readings of a log file carry its name (``file`` label), so a failed or garbage log is found."""
    tag = (("file", name[:FILE_MAX]),)
    return [dataclasses.replace(r, labels=labels_of({**dict(r.labels), **dict(tag)})) for r in readings]


class LogTail:
    """Finds settled log files matching a glob; each path is returned once."""

    def __init__(self, pattern: str, settle_seconds: float, clock: Callable[[], float]) -> None:
        self.pattern = pattern
        self.settle_seconds = settle_seconds
        self.clock = clock
        self.seen: set[str] = set()

    def poll(self) -> list[Path]:
        now = self.clock()
        ready = []
        # glob.glob, not Path.glob: the pattern is absolute and may have wildcards in directories.
        for name in sorted(glob.glob(self.pattern)):
            path = Path(name)
            if name in self.seen or not path.is_file():
                continue
            if now - path.stat().st_mtime >= self.settle_seconds:
                self.seen.add(name)
                ready.append(path)
        return ready


@dataclass(frozen=True, slots=True)
class NcclFactories(CollectorFactories):
    runner: Callable[[], CommandRunner] = SubprocessRunner
    monotonic: Callable[[], float] = time.monotonic  # when a run is due
    wall_clock: Callable[[], float] = time.time  # against log files' mtimes


class NcclCollector:
    name: ClassVar[str] = "nccl"
    Options: ClassVar[type[CollectorOptions]] = NcclOptions

    def __init__(self, ctx: CollectorContext) -> None:
        assert isinstance(ctx.options, NcclOptions)
        self.options = ctx.options
        factories = ctx.factories_for(NcclFactories)
        self.runner = factories.runner()
        self.monotonic = factories.monotonic
        self.tail = None
        if self.options.log_glob:
            self.tail = LogTail(self.options.log_glob, self.options.settle_seconds, factories.wall_clock)
        self.op = op_from_command(self.options.command or [])
        self.job = JobModel.of(self.options)
        self.task: asyncio.Task[CommandResult] | None = None
        self.next_due = 0.0
        self.skipped = 0

    async def collect(self) -> Sequence[Reading]:
        if self.tail is not None:
            return self._collect_logs()
        out = self._finished()
        self._maybe_start()
        out.append(
            Reading(
                SOURCE,
                self.op or "nccl",
                "",
                "runs_skipped",
                float(self.skipped),
                "runs",
                kind=Kind.COUNTER,
                name="runs_skipped",
                width=0,
            )
        )
        return out

    def _collect_logs(self) -> list[Reading]:
        assert self.tail is not None
        out: list[Reading] = []
        for path in self.tail.poll():
            op = op_from_name(path.name)
            for run in parse_nccl_runs(path.read_text(errors="replace"), op=op):
                out.extend(with_file(run_readings(run, run.op or op or "nccl", self.job), path.name))
        return out

    def _finished(self) -> list[Reading]:
        if self.task is None or not self.task.done():
            return []
        task, self.task = self.task, None
        op = self.op or "nccl"
        try:
            result = task.result()
        except Exception as exc:  # a broken runner is a failed run, reported, not a dead collector
            return [failure_event(op, "runner_error", f"{type(exc).__name__}: {exc}")]
        return result_readings(result, op, self.job)

    def _maybe_start(self) -> None:
        # Due on a fixed grid, with a tenth of the interval's slack: the agent's scrape that should
        # start a run comes a hair before ``next_due`` as often as after it, and a strict check
        # skipped every other run (NCCL results every 2 intervals instead of every one).
        now = self.monotonic()
        every = self.options.interval_seconds
        if now < self.next_due - 0.1 * every:
            return
        self.next_due = self.next_due + every if now - self.next_due < every else now + every
        if self.task is not None:
            self.skipped += 1  # never overlap: the previous run still holds the GPUs
            return
        assert self.options.command is not None
        self.task = asyncio.create_task(self.runner.run(self.options.command, self.options.timeout_seconds))

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
