"""NCCL-tests stand-in: what ``all_reduce_perf`` would print for a simulated job.

The text follows the real modern format (``shared/fixtures/nccl-tests/a3mega_all_reduce_perf_2node_16xH100.txt``
and the 2.18.0 capture): version and parameter header, one ``#  Rank`` line per GPU naming its host,
the two-line column header with ``redop root ... #wrong``, rows of out-of-place and in-place
``time algbw busbw #wrong``, ``# Out of bounds values : 0 OK`` and ``# Avg bus bandwidth``.
Units as nccl-tests prints them: time in microseconds, bandwidths in GB/s with G = 1e9.

A healthy job's time follows the usual alpha-beta shape: ``time = latency + bytes_on_wire / bw``,
with all-reduce moving 2(n-1)/n of the buffer per rank (``busbw = algbw x 2(n-1)/n``, nccl-tests
PERFORMANCE.md). Bandwidth peaks at 85 % of the node's HCAs' line rate (the a3mega capture peaks at
338 GB/s on 8 NICs).
"""

from __future__ import annotations

import random

from fabricd.sim.fabric import stable_hash
from fabricd.sim.model import Simulation

VERSION_LINE = "# nccl-tests version 2.17.8 nccl-headers=22703 nccl-library=22703"
LATENCY_US = 120.0  # small-message floor, as in the captures (~123 us for 2 x 8 H100)
PEAK_EFFICIENCY = 0.85
FIRST_SIZE = 8 * 1024 * 1024
SIZE_FACTOR = 8
GPU_MODEL = "NVIDIA H100 80GB HBM3"
BUS_IDS = ("04:00", "05:00", "0b:00", "0c:00", "84:00", "85:00", "8b:00", "8c:00")


def sizes(count: int) -> list[int]:
    return [FIRST_SIZE * SIZE_FACTOR**k for k in range(count)]


def run_output(sim: Simulation, node: str, t: float) -> str:
    """The output of the all_reduce_perf run ``node`` starts at scenario time ``t``."""
    members = sim.nccl_members(node, t)
    gpus = len(sim.fabric.ports_of[node])
    ranks = len(members) * gpus
    factor = sim.nccl_factor(members)
    peak = gpus * sim.fabric.line_bytes_per_second * PEAK_EFFICIENCY * factor  # bytes/s on the wire
    rng = random.Random(stable_hash(str(sim.scenario.seed), "nccl", sim.fabric.key(node), f"{t:.3f}"))
    rows = [_row(size, ranks, peak, factor, rng) for size in sizes(sim.scenario.workload.nccl_sizes)]
    avg = sum(r[1] for r in rows) / len(rows)
    return _render(members, gpus, rows, avg, rng)


def _row(size: int, ranks: int, peak: float, factor: float, rng: random.Random) -> tuple[str, float]:
    wire = 2.0 * (ranks - 1) / ranks
    cells = []
    busbws = []
    for _ in range(2):  # out-of-place, in-place
        time_us = (LATENCY_US / factor + size * wire / peak * 1e6) * (1 + abs(rng.gauss(0.0, 0.01)))
        algbw = size / (time_us * 1e-6) / 1e9
        busbw = algbw * wire
        busbws.append(busbw)
        cells.append(f"{_time(time_us):>9} {algbw:7.2f} {busbw:7.2f} {0:6d}")
    count = size // 4
    line = f"{size:>12} {count:>13} {'float':>9} {'sum':>7} {-1:>7}  " + "  ".join(cells)
    return line, sum(busbws) / 2


def _time(us: float) -> str:
    # nccl-tests prints %7.1f below 10 ms and an integer above (the a3mega capture: "12646").
    return f"{us:.1f}" if us < 10_000 else f"{us:.0f}"


def _render(members: list[str], gpus: int, rows: list[tuple[str, float]], avg: float, rng: random.Random) -> str:
    lines = [
        VERSION_LINE,
        f"# nThread 1 nGpus 1 minBytes {FIRST_SIZE} maxBytes {FIRST_SIZE * SIZE_FACTOR ** (len(rows) - 1)} "
        f"step: {SIZE_FACTOR}(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    rank = 0
    for host in members:
        for dev in range(gpus):
            pid = 6000 + rng.randrange(0, 3000)
            lines.append(
                f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10} device {dev:2d} "
                f"[0000:{BUS_IDS[dev % len(BUS_IDS)]}] {GPU_MODEL}"
            )
            rank += 1
    lines += [
        "#",
        "#                                                              out-of-place                       in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ",
    ]
    lines += [r[0] for r in rows]
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {avg:.3f} ", "#"]
    return "\n".join(lines) + "\n"
