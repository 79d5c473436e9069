"""fabricd.parsers.nccl on captures of old nccl-tests releases and of pastes that lost their "#"s,
against values copied from the text by hand (the shapes are those of ``tests/test_parsers_nccl.py``)."""

from __future__ import annotations

from fabricd.parsers.nccl import parse_nccl_runs
from tests.helpers import CASES
from tests.test_parsers_nccl import NA, Line, Run, summary

ISSUE37_LINE: Line = (4294967296, 134217728, "float", None, None, 29122, 129.05, 129.05, NA, 29169, 128.84, 128.84, NA)

ISSUE44_LINE: Line = (8, 2, "float", "sum", None, 7.18, 0.00, 0.00, NA, 7.02, 0.00, 0.00, NA)
NCCL1_FIRST: Line = (10000000, 10000000, "char", "sum", None, 1628, 6.14, 9.21, NA, 1932, 5.18, 7.77, NA)
NCCL1_LAST: Line = (10000000, 1250000, "double", "min", None, 1622, 6.16, 9.25, NA, 1623, 6.16, 9.24, NA)

OLD_FORMATS: dict[str, list[Run]] = {
    # NVIDIA/nccl-tests#44, cut after its first row: the op only on the root prompt "#  ./all_reduce_perf".
    "issue44_all_reduce_root_prompt_2x2080ti_excerpt": [
        ("all_reduce", "truncated", 2, None, 1, ISSUE44_LINE, ISSUE44_LINE),
    ],
    # NCCL 1's all_reduce_test (NVIDIA/nccl v1.3.4-1 README): "bytes N type op ... res", times in ms
    # (1.628 ms is 1628 us), one size, a row per (type, op), no parameter line and no summary.
    "nccl1_readme_all_reduce_test_4xtitanx_ms_times": [(None, "ok", None, None, 20, NCCL1_FIRST, NCCL1_LAST)],
    # NVIDIA/nccl-tests#37: every "#" lost in the paste, the old "error" column, "Out of bounds ... FAILED".
    "issue37_all_gather_no_hash_error_column_oob_failed": [
        ("all_gather", "failed", None, 128.942, 1, ISSUE37_LINE, ISSUE37_LINE),
    ],
    # A DGX-2 running five ops with nccl-tests of 2019 ("error" column, no "root" but for broadcast and
    # reduce, broadcast without "redop"), each run named by its "Running: ... ./build/<op>_perf" line.
    "wohlbier_dgx2_five_ops_2019_error_column_running_banners": [
        (
            "all_gather",
            "failed",  # "# Out of bounds values : 4 FAILED"
            12,
            30.2993,
            31,
            (0, 0, "float", None, None, 57.30, 0.00, 0.00, NA, 57.09, 0.00, 0.00, NA),
            (8589934560, 178956970, "float", None, None, 106773, 73.75, 73.75, NA, 70089, 112.34, 112.34, NA),
        ),
        (
            "all_reduce",
            "ok",
            12,
            42.5578,
            31,
            (8, 2, "float", "sum", None, 61.03, 0.00, 0.00, NA, 61.04, 0.00, 0.00, NA),
            (8589934592, 2147483648, "float", "sum", None, 127453, 67.40, 123.56, NA, 127443, 67.40, 123.57, NA),
        ),
        (
            "broadcast",
            "ok",
            12,
            41.2456,
            31,
            (8, 2, "float", None, 0, 59.75, 0.00, 0.00, NA, 59.96, 0.00, 0.00, NA),
            (8589934592, 2147483648, "float", None, 0, 70321, 122.15, 122.15, NA, 70368, 122.07, 122.07, NA),
        ),
        (
            "reduce",
            "ok",
            12,
            41.3386,
            31,
            (8, 2, "float", "sum", 0, 58.15, 0.00, 0.00, NA, 59.52, 0.00, 0.00, NA),
            (8589934592, 2147483648, "float", "sum", 0, 69989, 122.73, 122.73, NA, 70007, 122.70, 122.70, NA),
        ),
        (
            "reduce_scatter",
            "ok",
            12,
            20.3609,
            31,
            (0, 0, "float", "sum", None, 58.16, 0.00, 0.00, NA, 58.77, 0.00, 0.00, NA),
            (8589934560, 178956970, "float", "sum", None, 122722, 64.16, 64.16, NA, 123574, 63.72, 63.72, NA),
        ),
    ],
}


def test_each_old_format_fixture_gives_the_runs_and_values_its_text_shows() -> None:
    for case, runs in OLD_FORMATS.items():
        assert summary(case) == runs, case


def test_headers_and_summary_without_their_hash_are_read() -> None:
    # nccl-tests#37 as pasted: without the "#" fix the table header was no header: no row, "truncated".
    (run,) = parse_nccl_runs(
        (CASES / "nccl" / "issue37_all_gather_no_hash_error_column_oob_failed" / "input.txt").read_text()
    )
    assert [(r.placement, r.error, r.wrong) for r in run.rows] == [("out_of_place", 1.0, None), ("in_place", 1.0, None)]
    assert (run.out_of_bounds, run.out_of_bounds_ok, run.avg_busbw_gbps) == (2, False, 128.942)
    # nccl-tests before 2019-03 printed its parameter line bare (nccl-tests#7, wm10240, 2018-04-25).
    bare = "nThread 1 nGpus 8 minBytes 9 maxBytes 33554432 step: 1048576(bytes) warmup iters: 5 iters: 20 validation: 1"
    (old,) = parse_nccl_runs(bare + "\n")
    assert (old.n_threads, old.n_gpus) == (1, 8)


def test_the_2017_table_reads_milliseconds_and_its_res_column() -> None:
    # Without the old layout the "bytes N ..." header was no header: no row, a "truncated" run.
    text = (CASES / "nccl" / "nccl1_readme_all_reduce_test_4xtitanx_ms_times" / "input.txt").read_text()
    (run,) = parse_nccl_runs(text)
    half_sum = [r for r in run.rows if (r.dtype, r.redop) == ("half", "sum")]
    assert [(r.time_seconds, r.time_us, r.error) for r in half_sum] == [
        (0.001617, 1617.0, 0.004),
        (0.001636, 1636.0, 0.004),
    ]
    assert (run.status, run.error, len(run.rows)) == ("ok", None, 40)


def test_a_rank_line_without_pid_is_a_rank() -> None:
    # nccl-tests before 2019-03 (src/common.cu @ dcf8189): printf("#   Rank %2d on %10s device %2d [0x%02x] %s\n", ...).
    text = "nThread 1 nGpus 2 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20 validation: 1 \n"
    text += "#   Rank  0 on       ncrh device  0 [0x05] GeForce RTX 2080 Ti\n#   Rank  1 on       ncrh device  1 [0x06] GeForce RTX 2080 Ti\n"
    (run,) = parse_nccl_runs(text)
    assert [(r.rank, r.host, r.device, r.bus_id, r.model) for r in run.ranks] == [
        (0, "ncrh", 0, "0x05", "GeForce RTX 2080 Ti"),
        (1, "ncrh", 1, "0x06", "GeForce RTX 2080 Ti"),
    ]
