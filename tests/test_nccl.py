"""NCCL-tests: the pure parser on every real fixture, and the collector running real commands."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from collectors.nccl import NcclCollector, NcclFactories, op_from_command
from fabricd.collector import CollectorConfigError, build
from fabricd.command import CommandResult, SubprocessRunner
from fabricd.model import Kind, Reading
from fabricd.parsers.nccl import parse_nccl_output, parse_nccl_runs
from tests.helpers import CASES, need_binary

NCCL_CASES = sorted(p for p in (CASES / "nccl").iterdir() if p.is_dir())
UPDATE = os.environ.get("UPDATE_GOLDEN", "") == "1"
REGISTRY = {"nccl": "collectors.nccl:NcclCollector"}


def _parse_case(case: Path) -> list[dict[str, object]]:
    op = op_from_command(shlex.split((case / "command.txt").read_text()))
    return [run.to_json() for run in parse_nccl_runs((case / "input.txt").read_text(), op=op)]


@pytest.mark.parametrize("case", NCCL_CASES, ids=[p.name for p in NCCL_CASES])
def test_fixture_parses_to_expected(case: Path) -> None:
    got = _parse_case(case)
    if UPDATE:
        (case / "expected.json").write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads((case / "expected.json").read_text())


@pytest.mark.parametrize("case", NCCL_CASES, ids=[p.name for p in NCCL_CASES])
def test_avg_busbw_matches_nccl_tests_own_average(case: Path) -> None:
    # Oracle: nccl-tests prints the mean busbw over every row and placement; the parsed rows
    # (in bytes/s) must average to it within the table's 2-decimal rounding.
    for run in parse_nccl_runs((case / "input.txt").read_text()):
        busbw = [r.busbw_bytes_per_second for r in run.rows if r.busbw_bytes_per_second is not None]
        if run.avg_busbw_bytes_per_second is None:
            # NCCL 1's own tests print no average (nccl1_*): the others must be flagged incomplete.
            assert not busbw or run.reason == "incomplete" or case.name.startswith("nccl1_")
            continue
        assert sum(busbw) / len(busbw) == pytest.approx(run.avg_busbw_bytes_per_second, abs=0.01e9)


def test_every_fixture_format_is_covered() -> None:
    runs = {c.name: parse_nccl_output((c / "input.txt").read_text()) for c in NCCL_CASES}
    legacy = runs["superbench_all_reduce_legacy"]
    assert legacy.rows[0].wrong is None and legacy.rows[0].root is None and legacy.nranks == 8
    assert runs["superbench_all_gather_legacy"].rows[0].redop is None
    assert runs["superbench_alltoall_legacy"].rows[0].redop == ""
    tagged = runs["ebpf_all_reduce_mpi_2.18.0_tagged"]
    assert (tagged.op, tagged.version, len(tagged.rows)) == ("all_reduce", "2.18.0", 16)
    peak = max(r.busbw_bytes_per_second or 0 for r in runs["a3mega_all_reduce_2node_16xH100"].rows)
    assert peak == 338.82e9  # GB/s means 1e9 bytes/s


def test_wrong_values_and_out_of_bounds_fail_the_run() -> None:
    run = parse_nccl_output((CASES / "nccl/issue369_all_reduce_wrong_failed/input.txt").read_text())
    wrong = {(r.size_bytes, r.placement): r.wrong for r in run.rows if r.wrong}
    assert wrong == {(1048576, "out_of_place"): 96, (1048576, "in_place"): 32}
    assert (run.success, run.reason, run.out_of_bounds) == (False, "out_of_bounds", 4)


def test_aborted_run_names_the_cuda_error() -> None:
    run = parse_nccl_output((CASES / "nccl/issue369_all_reduce_cuda_busy_abort/input.txt").read_text())
    assert not run.rows and not run.success
    assert run.reason == "cuda_failure" and "busy or unavailable" in run.detail


def test_truncated_table_is_incomplete() -> None:
    text = (CASES / "nccl/a3mega_all_reduce_2node_16xH100/input.txt").read_text()
    cut = text[: text.index("# Out of bounds")]
    assert parse_nccl_output(cut).reason == "incomplete"


# --- the collector, running real processes -------------------------------------------------------


def _script(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "all_reduce_perf"
    script.write_text(body)
    return [sys.executable, str(script)]


def _printer(tmp_path: Path, case: str, exit_code: int = 0) -> list[str]:
    fixture = CASES / "nccl" / case / "input.txt"
    body = f"import sys\nsys.stdout.write(open({str(fixture)!r}).read())\nsys.exit({exit_code})\n"
    return _script(tmp_path, body)


def _collector(command: Sequence[str], **options: object) -> NcclCollector:
    raw = {"command": list(command), "interval_seconds": 0, "timeout_seconds": 10, **options}
    collector = build("nccl", raw, node="n1", sysfs_root=Path("/sys"), registry=REGISTRY)
    assert isinstance(collector, NcclCollector)
    return collector


async def _collect_until(collector: NcclCollector, pred_kind: Kind, limit: float = 15) -> list[Reading]:
    got: list[Reading] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got.extend(await collector.collect())
        if any(r.kind is pred_kind for r in got if r.counter != "runs_skipped"):
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {pred_kind} reading within {limit}s: {got}")


def _events(readings: Sequence[Reading]) -> list[dict[str, str]]:
    return [dict(r.labels) for r in readings if r.kind is Kind.EVENT]


async def test_successful_run_emits_per_size_bandwidth(tmp_path: Path) -> None:
    collector = _collector(_printer(tmp_path, "a3mega_all_reduce_2node_16xH100"))
    readings = await _collect_until(collector, Kind.GAUGE)
    await collector.close()
    busbw = {
        dict(r.labels)["size"]: r.value
        for r in readings
        if r.counter == "busbw" and dict(r.labels).get("placement") == "out_of_place"
    }
    assert busbw["8589934592"] == 338.82e9 and len(busbw) == 31
    success = [r for r in readings if r.counter == "success"]
    assert [(r.device, r.value) for r in success] == [("all_reduce", 1.0)]
    assert not _events(readings)


async def test_nonzero_exit_is_a_failure_event(tmp_path: Path) -> None:
    collector = _collector(_printer(tmp_path, "a3mega_all_reduce_2node_16xH100", exit_code=3))
    readings = await _collect_until(collector, Kind.EVENT)
    await collector.close()
    assert _events(readings)[0]["reason"] == "exit_code"
    assert _events(readings)[0]["detail"] == "exit status 3"


async def test_failed_output_is_a_failure_event(tmp_path: Path) -> None:
    # nccl-tests itself exits 0 after printing FAILED in some versions: the output decides.
    collector = _collector(_printer(tmp_path, "issue369_all_reduce_wrong_failed"))
    readings = await _collect_until(collector, Kind.EVENT)
    await collector.close()
    assert _events(readings)[0]["reason"] == "out_of_bounds"
    wrong = [r for r in readings if r.counter == "wrong" and r.value > 0]
    assert {r.value for r in wrong} == {96.0, 32.0}


async def test_timeout_kills_the_run_and_reports_it() -> None:
    sleep = need_binary("sleep")
    collector = _collector([sleep, "30"], timeout_seconds=0.5)
    started = time.monotonic()
    readings = await _collect_until(collector, Kind.EVENT)
    await collector.close()
    assert time.monotonic() - started < 10  # killed at the timeout, not after 30 s
    assert _events(readings)[0]["reason"] == "timeout"


async def test_missing_binary_is_a_failure_event() -> None:
    collector = _collector(["/nonexistent/all_reduce_perf", "-b", "8"])
    readings = await _collect_until(collector, Kind.EVENT)
    await collector.close()
    assert _events(readings)[0]["reason"] == "spawn_error"


class _CountingRunner:
    """The real subprocess runner, wrapped to record how many runs were in flight at once."""

    def __init__(self) -> None:
        self.inner = SubprocessRunner()
        self.active = 0
        self.max_active = 0
        self.runs = 0

    async def run(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult:
        self.active += 1
        self.runs += 1
        self.max_active = max(self.max_active, self.active)
        try:
            return await self.inner.run(argv, timeout_seconds)
        finally:
            self.active -= 1


async def test_runs_never_overlap_and_skips_are_counted() -> None:
    sleep = need_binary("sleep")
    runner = _CountingRunner()
    raw = {"command": [sleep, "0.6"], "interval_seconds": 0, "timeout_seconds": 5}
    collector = build(
        "nccl",
        raw,
        node="n1",
        sysfs_root=Path("/sys"),
        registry=REGISTRY,
        factories=[NcclFactories(runner=lambda: runner)],
    )
    assert isinstance(collector, NcclCollector)
    skipped = 0.0
    for _ in range(12):  # due on every call, but a run takes 0.6 s
        for r in await collector.collect():
            if r.counter == "runs_skipped":
                skipped = r.value
        await asyncio.sleep(0.1)
    await collector.close()
    assert runner.max_active == 1
    assert runner.runs >= 2 and skipped >= 6


async def test_log_glob_parses_each_complete_file_once(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    old = time.time() - 60
    cases = {
        "alltoall_perf-101.log": "superbench_alltoall_legacy",
        "all_reduce_perf-102.log": "issue369_all_reduce_cuda_busy_abort",
    }
    for name, case in cases.items():
        path = logs / name
        path.write_text((CASES / "nccl" / case / "input.txt").read_text())
        os.utime(path, (old, old))
    (logs / "still_writing.log").write_text("# nThread 1 nGpus 8\n")  # fresh mtime: not settled
    collector = build(
        "nccl",
        {"log_glob": str(logs / "*.log"), "settle_seconds": 5},
        node="n1",
        sysfs_root=Path("/sys"),
        registry=REGISTRY,
    )
    first = await collector.collect()
    second = await collector.collect()
    assert {r.device for r in first if r.counter == "success"} == {"alltoall", "all_reduce"}
    assert [e["reason"] for e in _events(first)] == ["cuda_failure"]
    assert not [r for r in second if r.counter in {"success", "busbw"}]


async def test_a_log_of_several_runs_reports_each_with_its_op_and_file(tmp_path: Path) -> None:
    text = (CASES / "nccl" / "assembled_three_runs_with_banners" / "input.txt").read_text()
    readings = await _from_logs(tmp_path, {"nightly.log": text})
    avg = {(r.device, dict(r.labels)["file"]): r.value for r in readings if r.counter == "avg_busbw"}
    assert avg == {
        ("all_reduce", "nightly.log"): 68404800000.0,
        ("all_gather", "nightly.log"): 58265100000.0,
        ("alltoall", "nightly.log"): 58648100000.0,
    }


def test_options_need_exactly_one_source() -> None:
    with pytest.raises(CollectorConfigError, match=r"collectors\.nccl"):
        build("nccl", {}, node="n1", sysfs_root=Path("/sys"), registry=REGISTRY)
    with pytest.raises(CollectorConfigError, match=r"collectors\.nccl\..*exactly one"):
        build(
            "nccl", {"command": ["x"], "log_glob": "/tmp/*.log"}, node="n1", sysfs_root=Path("/sys"), registry=REGISTRY
        )


# --- the job's shape and the model's assumptions (what the agent's efficiency needs) ----------------

# (nodes, ranks) read off each fixture's "#  Rank N ... on <host>" lines by hand.
SHAPES = {
    "a3mega_all_reduce_2node_16xH100": (2, 16),
    "oci_all_reduce_2node_16xA100_rdma": (2, 16),
    "issue369_all_reduce_wrong_failed": (2, 2),  # two GH200 hosts, one rank each
    "ebpf_all_reduce_mpi_2.18.0_tagged": (1, 2),  # two MPI ranks on one host
    "superbench_all_gather_legacy": (1, 8),  # one process driving 8 GPUs
}


async def _from_logs(tmp_path: Path, files: dict[str, str], **options: object) -> list[Reading]:
    logs = tmp_path / "logs"
    logs.mkdir(parents=True)
    for name, text in files.items():
        (logs / name).write_text(text)
    raw = {"log_glob": str(logs / "*.log"), "settle_seconds": 0, **options}
    collector = build("nccl", raw, node="n1", sysfs_root=Path("/sys"), registry=REGISTRY)
    return list(await collector.collect())


def _shape(readings: Sequence[Reading]) -> dict[str, float]:
    return {r.counter: r.value for r in readings if r.counter in {"nodes", "ranks"}}


@pytest.mark.parametrize("case", sorted(SHAPES))
async def test_each_run_reports_its_job_shape(tmp_path: Path, case: str) -> None:
    text = (CASES / "nccl" / case / "input.txt").read_text()
    readings = await _from_logs(tmp_path, {f"{case}.log": text}, nodes=64)  # the log's hosts win
    nodes, ranks = SHAPES[case]
    assert _shape(readings) == {"nodes": nodes, "ranks": ranks}
    assert {r.kind for r in readings if r.counter in {"nodes", "ranks"}} == {Kind.GAUGE}


async def test_nodes_option_sizes_a_log_without_rank_lines(tmp_path: Path) -> None:
    text = (CASES / "nccl/superbench_all_reduce_legacy/input.txt").read_text()
    bare = "".join(line for line in text.splitlines(keepends=True) if "  Rank " not in line)
    assert _shape(await _from_logs(tmp_path / "a", {"x.log": bare})) == {}  # unknown, not guessed
    # nGpus 8 x nThread 1 per process, one process per node (a per-node ``-g 8`` launch).
    assert _shape(await _from_logs(tmp_path / "b", {"x.log": bare}, nodes=4)) == {"nodes": 4, "ranks": 32}


async def test_model_assumptions_follow_the_options(tmp_path: Path) -> None:
    text = (CASES / "nccl/a3mega_all_reduce_2node_16xH100/input.txt").read_text()

    def model(readings: Sequence[Reading]) -> list[tuple[float, dict[str, str]]]:
        return [(r.value, dict(r.labels)) for r in readings if r.counter == "model_efficiency"]

    assert model(await _from_logs(tmp_path / "a", {"x.log": text})) == [(0.9, {"algo": "ring", "file": "x.log"})]
    tuned = await _from_logs(tmp_path / "b", {"x.log": text}, algo="tree", model_efficiency=0.87)
    assert model(tuned) == [(0.87, {"algo": "tree", "file": "x.log"})]
    with pytest.raises(CollectorConfigError, match=r"collectors\.nccl\.algo"):
        build(
            "nccl", {"log_glob": "/x/*.log", "algo": "butterfly"}, node="n1", sysfs_root=Path("/sys"), registry=REGISTRY
        )
    with pytest.raises(CollectorConfigError, match=r"collectors\.nccl\.model_efficiency"):
        build(
            "nccl",
            {"log_glob": "/x/*.log", "model_efficiency": 1.5},
            node="n1",
            sysfs_root=Path("/sys"),
            registry=REGISTRY,
        )
