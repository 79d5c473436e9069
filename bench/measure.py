"""Measurement helpers for ``make bench``: CPU of child processes and of running PIDs, robust stats.

Absolute times on a shared 2-core machine are noise; every figure is reported as the median of
several runs after a warm-up (with min and max), and comparisons are ratios computed pair by pair
within the same run.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Stat:
    median: float
    min: float
    max: float
    runs: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        return cls(statistics.median(values), min(values), max(values), len(values))

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.min, "max": self.max, "runs": self.runs}


@dataclass(frozen=True)
class ChildUsage:
    cpu_seconds: float  # user + sys
    max_rss_bytes: int
    wall_seconds: float
    returncode: int


def run_child(argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 600) -> ChildUsage:
    """Run ``argv`` to completion and read its own rusage (wait4), not the parent's."""
    import time

    start = time.perf_counter()
    proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {err[-2000:]}")
    if proc.stderr:
        proc.stderr.close()
    return ChildUsage(usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, wall, proc.returncode)


def pid_cpu_seconds(pid: int) -> float:
    """user+sys CPU seconds of a running process, from /proc/<pid>/stat (fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def postgres_cpu_seconds() -> float:
    """user+sys CPU seconds of every ``postgres`` process on this machine (the backends, the WAL
    writer, the checkpointer): the database's share of a run, beside its client's. Machine-wide,
    so meaningful on a machine where nothing else uses PostgreSQL meanwhile."""
    pids = subprocess.run(["pgrep", "-x", "postgres"], capture_output=True, text=True).stdout.split()
    total = 0.0
    for pid in pids:
        try:
            total += pid_cpu_seconds(int(pid))
        except OSError:  # ended meanwhile (a backend of a closed connection)
            continue
    return total


def pid_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def repeat(fn: Callable[[], float], runs: int, warmup: int = 1) -> Stat:
    for _ in range(warmup):
        fn()
    return Stat.of([fn() for _ in range(runs)])
