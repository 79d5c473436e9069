"""fabricd.parsers.nccl on every NCCL/RCCL fixture against expectations copied from the text by hand
(not from the parser): the runs each file holds, their op, status, ranks, average, row count, and the
first and last table line of each run, cell by cell. Then the launcher prefixes, broken rows, and
property tests: no text makes the parser raise, and junk becomes a run record."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fabricd.parsers import launcher
from fabricd.parsers.nccl import parse_nccl_runs
from fabricd.parsers.records import nccl_json
from tests.helpers import CASES

NA = None  # "N/A" in the text
# (size, count, type, redop, root, oop time, algbw, busbw, #wrong, ip time, algbw, busbw, #wrong)
Line = tuple[int, int, str, str | None, int | None, float, float, float, int | None, float, float, float, int | None]
# (op, status, nranks, avg bus bandwidth, sizes, first line, last line)
Run = tuple[str | None, str, int | None, float | None, int, Line | None, Line | None]

LEGACY_AR_FIRST: Line = (0, 0, "float", "sum", None, 35.20, 0.00, 0.00, NA, 34.05, 0.00, 0.00, NA)
LEGACY_AR_LAST: Line = (
    8589934592,
    2147483648,
    "float",
    "sum",
    None,
    63896,
    134.44,
    235.26,
    NA,
    63959,
    134.30,
    235.03,
    NA,
)
LEGACY_AG_FIRST: Line = (0, 0, "float", None, None, 34.27, 0.00, 0.00, NA, 33.57, 0.00, 0.00, NA)
LEGACY_AG_LAST: Line = (
    8589934592,
    268435456,
    "float",
    None,
    None,
    33646,
    255.31,
    223.39,
    NA,
    32669,
    262.94,
    230.07,
    NA,
)
LEGACY_A2A_FIRST: Line = (0, 0, "float", None, None, 1.63, 0.00, 0.00, NA, 1.38, 0.00, 0.00, NA)
LEGACY_A2A_LAST: Line = (
    8589934592,
    268435456,
    "float",
    None,
    None,
    33508,
    256.36,
    224.31,
    NA,
    33234,
    258.47,
    226.16,
    NA,
)

EXPECTED: dict[str, list[Run]] = {
    "a3mega_all_reduce_2node_16xH100": [
        (
            None,
            "ok",
            16,
            70.742,
            31,
            (8, 2, "float", "sum", -1, 135.8, 0.00, 0.00, 0, 123.5, 0.00, 0.00, 0),
            (8589934592, 2147483648, "float", "sum", -1, 47535, 180.71, 338.82, 0, 47743, 179.92, 337.35, 0),
        ),
    ],
    "ebpf_all_reduce_mpi_2.18.0_tagged": [
        (
            "all_reduce",
            "ok",
            2,
            1.57614,
            8,
            (1048576, 262144, "float", "sum", -1, 4366.46, 0.24, 0.24, 0, 4365.21, 0.24, 0.24, 0),
            (134217728, 33554432, "float", "sum", -1, 58479.5, 2.30, 2.30, 0, 58055.4, 2.31, 2.31, 0),
        ),
    ],
    "ebpf_broadcast_mpi_2.18.0_root0_none": [  # redop "none", root 0, "#wrong " with a trailing blank
        (
            "broadcast",
            "ok",
            2,
            0.8664,
            9,
            (1024, 256, "float", "none", 0, 2239.78, 0.00, 0.00, 0, 2233.58, 0.00, 0.00, 0),
            (67108864, 16777216, "float", "none", 0, 28066.8, 2.39, 2.39, 0, 37664.5, 1.78, 1.78, 0),
        ),
    ],
    "rccl_issue876_all_reduce_old_nthreads_colon_nccl_failure": [(None, "failed", 2, None, 0, None, None)],
    "issue290_all_reduce_2node_16xH100_srun_label": [
        (
            None,
            "ok",
            16,
            142.735,
            11,
            (8388608, 2097152, "float", "sum", -1, 215.3, 38.96, 73.04, NA, 180.0, 46.60, 87.38, NA),
            (8589934592, 2147483648, "float", "sum", -1, 103530, 82.97, 155.57, NA, 103538, 82.96, 155.56, NA),
        ),
    ],
    "issue369_all_reduce_cuda_busy_abort": [("all_reduce", "failed", 8, None, 0, None, None)],
    # NVIDIA/nccl-tests#287: a table header and no row, then the failure (NCCL_DEBUG=INFO log around it).
    "issue287_all_reduce_2x5090_nccl_debug_info_nccl_failure": [("all_reduce", "failed", 2, None, 0, None, None)],
    "issue287_alltoall_5090_nccl_debug_info_hash_no_space_cuda_failure": [
        ("alltoall", "failed", 1, None, 0, None, None),  # op from "./alltoall_perf" on the prompt line
    ],
    "issue287_all_reduce_1x5090_inplace_no_copy_avg_zero": [  # 1 GPU: busbw 0, in-place algbw in the millions
        (
            "all_reduce",
            "ok",
            1,
            0.0,
            25,
            (8, 2, "float", "sum", -1, 5.63, 0.00, 0.00, 0, 0.20, 0.04, 0.00, 0),
            (134217728, 33554432, "float", "sum", -1, 175.6, 764.34, 0.00, 0, 0.08, 1777718.25, 0.00, 0),
        ),
    ],
    "issue369_all_reduce_wrong_failed": [
        (
            "all_reduce",
            "failed",
            2,
            4.79995,
            25,
            (8, 2, "float", "sum", -1, 17.49, 0.00, 0.00, 0, 16.41, 0.00, 0.00, 0),
            (134217728, 33554432, "float", "sum", -1, 5869.38, 22.87, 22.87, 0, 5886.67, 22.80, 22.80, 0),
        ),
    ],
    "oci_all_reduce_2node_16xA100_rdma": [
        (
            None,
            "ok",
            16,
            188.648,
            3,
            (1073741824, 268435456, "float", "sum", -1, 10776, 99.64, 186.83, 0, 10781, 99.60, 186.75, 0),
            (4294967296, 1073741824, "float", "sum", -1, 42381, 101.34, 190.02, 0, 42364, 101.38, 190.09, 0),
        ),
    ],
    "rccl_all_reduce_2node_16xMI308X_version_block": [
        (
            "all_reduce",
            "ok",
            16,
            95.233,
            22,
            (1024, 256, "float", "sum", -1, 40.86, 0.03, 0.05, 0, 39.88, 0.03, 0.05, 0),
            (2147483648, 536870912, "float", "sum", -1, 12816, 167.56, 314.17, 0, 12829, 167.39, 313.87, 0),
        ),
    ],
    "superbench_all_reduce_legacy": [(None, "ok", 8, 68.4048, 34, LEGACY_AR_FIRST, LEGACY_AR_LAST)],
    "superbench_all_gather_legacy": [(None, "ok", 8, 58.2651, 34, LEGACY_AG_FIRST, LEGACY_AG_LAST)],
    "superbench_alltoall_legacy": [(None, "ok", 8, 58.6481, 34, LEGACY_A2A_FIRST, LEGACY_A2A_LAST)],
    "assembled_three_runs_with_banners": [  # the op of each from its "======== <op>_perf ========" banner
        ("all_reduce", "ok", 8, 68.4048, 34, LEGACY_AR_FIRST, LEGACY_AR_LAST),
        ("all_gather", "ok", 8, 58.2651, 34, LEGACY_AG_FIRST, LEGACY_AG_LAST),
        ("alltoall", "ok", 8, 58.6481, 34, LEGACY_A2A_FIRST, LEGACY_A2A_LAST),
    ],
    "synthetic_2.18_timestamps_cputime_per_iteration": [
        (
            "all_reduce",
            "ok",
            2,
            55.2183,
            3,  # -S: "... 0  2026-11-30 09:01:10"
            (1048576, 262144, "float", "sum", -1, 25.11, 41.76, 41.76, 0, 24.87, 42.16, 42.16, 0),
            (4194304, 1048576, "float", "sum", -1, 61.47, 68.23, 68.23, 0, 61.02, 68.74, 68.74, 0),
        ),
        (
            "all_gather",
            "ok",
            2,
            67.4183,
            3,  # -C: the cputime column
            (1048576, 262144, "float", "sum", -1, 21.40, 49.00, 49.00, 0, 21.10, 49.70, 49.70, 0),
            (4194304, 1048576, "float", "sum", -1, 49.90, 84.05, 84.05, 0, 49.33, 85.03, 85.03, 0),
        ),
        (
            "reduce_scatter",
            "ok",
            2,
            63.105,
            3,  # -I -S: i_min i_max i_p99 i_cv% per placement
            (1048576, 262144, "float", "sum", -1, 22.81, 45.97, 45.97, 0, 22.64, 46.32, 46.32, 0),
            (4194304, 1048576, "float", "sum", -1, 52.70, 79.59, 79.59, 0, 52.41, 80.03, 80.03, 0),
        ),
    ],
    # Two processes each printing the run header (nccl-tests#213, #306): one failed run, not two.
    "issue213_all_reduce_two_unconnected_processes_headers": [(None, "failed", 4, None, 0, None, None)],
    "issue306_two_unconnected_processes_repeated_ranks": [(None, "failed", 8, None, 0, None, None)],
    "coreweave_pr43_all_reduce_gb200_nvl72_trimmed": [
        (
            None,
            "ok",
            1,  # the paste keeps one "# Rank" line (Rank 71)
            745.53,
            5,
            (536870912, 134217728, "float", "sum", -1, 1806.7, 297.16, 586.06, 0, 1835.9, 292.43, 576.74, 0),
            (8589934592, 2147483648, "float", "sum", -1, 20299, 423.16, 834.57, 0, 20006, 429.37, 846.82, 0),
        )
    ],
}


def _line(row: dict[str, object] | None) -> Line | None:
    if row is None:
        return None
    oop, ip = row["out_of_place"], row["in_place"]
    assert isinstance(oop, dict) and isinstance(ip, dict)
    cells = (row["size_bytes"], row["count"], row["dtype"], row["redop"], row["root"])
    return (
        *cells,
        *(oop[k] for k in ("time_us", "algbw_gbps", "busbw_gbps", "wrong")),
        *(ip[k] for k in ("time_us", "algbw_gbps", "busbw_gbps", "wrong")),
    )  # type: ignore[return-value]


def summary(case: str) -> list[Run]:
    text = (CASES / "nccl" / case / "input.txt").read_text()
    out = []
    for run in parse_nccl_runs(text):
        doc = nccl_json(run, case)
        rows = doc["rows"]
        first, last = (_line(rows[0]), _line(rows[-1])) if rows else (None, None)
        out.append((doc["op"], doc["status"], doc["nranks"], doc["avg_busbw_gbps"], len(rows), first, last))
    return out


def test_every_nccl_fixture_has_hand_written_expectations() -> None:
    from tests.test_parsers_nccl_old import OLD_FORMATS  # the cases of old releases and lost "#"s

    assert set(EXPECTED) | set(OLD_FORMATS) == {p.name for p in (CASES / "nccl").iterdir() if p.is_dir()}


def test_each_fixture_gives_the_runs_and_values_its_text_shows() -> None:
    for case, runs in EXPECTED.items():
        assert summary(case) == runs, case


def test_errors_say_what_went_wrong() -> None:
    wrong = parse_nccl_runs((CASES / "nccl" / "issue369_all_reduce_wrong_failed" / "input.txt").read_text())
    assert wrong[0].error == "out_of_bounds: 4 out-of-bounds values"  # "# Out of bounds values : 4 FAILED"
    busy = parse_nccl_runs((CASES / "nccl" / "issue369_all_reduce_cuda_busy_abort" / "input.txt").read_text())
    assert busy[0].error == "cuda_failure: common.cu:1304 'CUDA-capable device(s) is/are busy or unavailable'"


def test_old_rccl_tests_header_and_one_line_rccl_version() -> None:
    # ROCm/rccl#876: "# nThreads: 1 nGpus: 2 nRanks: 1 ..." and "RCCL version 2.17.1+hip5.7 HEAD:cbbb3d8+".
    case = "rccl_issue876_all_reduce_old_nthreads_colon_nccl_failure"
    (run,) = parse_nccl_runs((CASES / "nccl" / case / "input.txt").read_text())
    assert (run.tool, run.versions, run.n_threads, run.n_gpus) == ("rccl-tests", {"rccl": "2.17.1", "hip": "5.7"}, 1, 2)
    assert [f.reason for f in run.failures] == ["nccl_failure", "aborted", "test_failure"]
    assert run.detail == "common.cu:1285 'unhandled cuda error'"


def test_nccl_version_from_the_info_line_under_nccl_debug_info() -> None:
    # NCCL_DEBUG=INFO prints "host:pid:tid [0] NCCL INFO NCCL version 2.25.1+cuda12.8", not the bare line.
    for case, cuda in (
        ("issue287_all_reduce_2x5090_nccl_debug_info_nccl_failure", "12.8"),
        ("issue287_alltoall_5090_nccl_debug_info_hash_no_space_cuda_failure", "12.4"),
    ):
        (run,) = parse_nccl_runs((CASES / "nccl" / case / "input.txt").read_text())
        assert run.versions == {"nccl": "2.25.1", "cuda": cuda}, case
    (busy,) = parse_nccl_runs(
        (CASES / "nccl" / "issue287_all_reduce_2x5090_nccl_debug_info_nccl_failure" / "input.txt").read_text()
    )
    assert busy.error == "nccl_failure: common.cu:392 'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '"
    assert [(r.host, r.device, r.bus_id) for r in busy.ranks] == [("GENOA-06", 0, "0x21"), ("GENOA-06", 1, "0x61")]
    (a2a,) = parse_nccl_runs(
        (CASES / "nccl" / "issue287_alltoall_5090_nccl_debug_info_hash_no_space_cuda_failure" / "input.txt").read_text()
    )
    # "#nThread 1 nGpus 1 ..." and "#Rank  0 Group ..." without the blank after "#" are still headers.
    assert (a2a.n_threads, a2a.n_gpus, a2a.ranks[0].bus_id) == (1, 1, "0000:16:00")
    assert a2a.error == "cuda_failure: common.cu:297 'an illegal memory access was encountered'"


def test_unconnected_processes_are_one_failed_run() -> None:
    # nccl-tests#213: the header twice, then one process's ranks; #306: ranks 0-7 of node3, then
    # ranks 0-4 of node2 (the excerpt's end). Before: two "truncated" runs, the second of 13 ranks.
    (run,) = parse_nccl_runs(
        (CASES / "nccl" / "issue213_all_reduce_two_unconnected_processes_headers" / "input.txt").read_text()
    )
    assert (run.status, run.error) == ("failed", "unconnected: 2 processes each printed their own run header")
    assert [r.host for r in run.ranks] == ["hw14"] * 4
    (run,) = parse_nccl_runs(
        (CASES / "nccl" / "issue306_two_unconnected_processes_repeated_ranks" / "input.txt").read_text()
    )
    assert run.error == "unconnected: 2 processes each printed their own run header; rank 0 is listed 2 times"
    assert (run.nranks, len(run.ranks), sorted({r.host for r in run.ranks})) == (8, 13, ["node2", "node3"])
    # A header repeated after a table, or after other lines, is still a new run.
    one = "# nThread 1 nGpus 1 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20 validation: 1\n"
    assert len(parse_nccl_runs(one + "x: Test CUDA failure common.cu:1 'boom'\n" + one)) == 2


def test_launcher_prefixes_are_stripped() -> None:
    assert launcher.unprefix(" 0: # nThread 1") == "# nThread 1"  # srun --label
    assert launcher.unprefix("12:      8388608") == "     8388608"
    assert launcher.unprefix("[1,0]<stdout>:# nccl-tests") == "# nccl-tests"  # Open MPI --tag-output
    assert launcher.unprefix("[1,3]<stderr>:Authorization required") == "Authorization required"
    assert launcher.unprefix("[3] #  Rank  3 Group") == "#  Rank  3 Group"  # MPICH -prepend-rank
    assert launcher.unprefix("node07: # Avg bus bandwidth    : 1.5") == "# Avg bus bandwidth    : 1.5"  # pdsh
    assert launcher.unprefix("gpu-1-1: Test CUDA failure common.cu:1304") == "Test CUDA failure common.cu:1304"
    assert launcher.unprefix("Warning: Permanently added 'x' (ED25519)") == "Warning: Permanently added 'x' (ED25519)"
    assert launcher.unprefix("rccl-tests: Version develop:83d38d9") == "rccl-tests: Version develop:83d38d9"
    assert launcher.unprefix("node01:  0: # nThread 1") == "# nThread 1"  # pdsh around srun


def test_pdsh_prefixed_run_with_nccl_info_and_a_broken_row_inside_the_table() -> None:
    text = (CASES / "nccl" / "oci_all_reduce_2node_16xA100_rdma" / "input.txt").read_text().splitlines()
    table = next(i for i, line in enumerate(text) if line.lstrip().startswith("1073741824"))
    noisy = [
        *text[:table],
        "node1:1234:1234 [0] NCCL INFO Channel 00/02 : 0 1",
        "  2147483648    536870912  float",
        *text[table:],
    ]
    [run] = parse_nccl_runs("\n".join(f"node1: {line}" for line in noisy))
    assert (run.status, len(run.rows), run.skipped_rows, run.avg_busbw_gbps) == ("ok", 6, 1, 188.648)


def test_a_run_cut_short_is_truncated() -> None:
    text = (CASES / "nccl" / "rccl_all_reduce_2node_16xMI308X_version_block" / "input.txt").read_text()
    cut = text[: text.index("   134217728")]
    [run] = parse_nccl_runs(cut)
    assert (run.status, run.error, len(run.rows)) == ("truncated", "incomplete: no summary after the table", 34)
    [header_only] = parse_nccl_runs(text[: text.index("#  Rank  0")])
    assert (header_only.status, header_only.error) == ("truncated", "aborted: no result table")


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_no_text_makes_it_raise_and_junk_is_a_run_record(junk: str) -> None:
    runs = parse_nccl_runs(junk)
    assert runs and all(nccl_json(r, "x")["status"] in {"ok", "failed", "truncated"} for r in runs)


LINES = (CASES / "nccl" / "ebpf_all_reduce_mpi_2.18.0_tagged" / "input.txt").read_text().splitlines()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(LINES), max_size=60), st.sampled_from(["", " 0: ", "[1,0]<stdout>:", "n1: "]))
def test_shuffled_real_lines_under_any_launcher_never_raise(lines: list[str], prefix: str) -> None:
    for run in parse_nccl_runs("\n".join(prefix + line for line in lines)):
        assert all(r.size_bytes >= 0 for r in run.rows)
