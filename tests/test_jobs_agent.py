"""The jobs collector on the agent: job files, the listpids check, GPU <-> HCA affinity."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from collectors.jobs import JobsCollector, JobsFactories
from fabricd.affinity import read_affinity, read_gpus, read_hcas, relation
from fabricd.collector import build
from fabricd.command import CommandResult
from fabricd.exposition import render
from fabricd.jobfiles import JobFileError, expand_hostlist, parse_gpus, parse_job_file, parse_listpids
from fabricd.model import Sample
from tests.helpers import CASES
from tests.support.pcitree import four_gpu_server

REGISTRY = {"jobs": "collectors.jobs:JobsCollector"}


def test_listpids_real_output() -> None:
    text = (CASES / "jobs" / "listpids_slurm22" / "output.txt").read_text()
    assert parse_listpids(text) == {"1": {14204, 14205}}
    assert parse_listpids("No job steps exist on this node.\n") == {}


def test_hostlists_and_gpus() -> None:
    assert expand_hostlist("gpu[01-03,07],login-a") == ("gpu01", "gpu02", "gpu03", "gpu07", "login-a")
    assert expand_hostlist("n[8-10]") == ("n8", "n9", "n10")
    assert parse_gpus("3,0,1-2") == (0, 1, 2, 3)
    with pytest.raises(JobFileError, match=r"gpus: 'GPU-1' is not a GPU index"):
        parse_gpus("GPU-1", "gpus")
    with pytest.raises(JobFileError, match=r"nodelist: 'a' in 'n\[a\]' is not a number or a range"):
        expand_hostlist("n[a]")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", r"/x/1.json: not JSON \(Expecting property name enclosed in double quotes at line 1 column 2\)"),
        ("[]", r"/x/1.json: a JSON object was expected, not list"),
        ('{"job_id": 7}', r"/x/1.json: job_id must be a string, not int"),
        ('{"job_id": "../etc"}', r"/x/1.json: job_id '../etc' is not a Slurm job id"),
    ],
)
def test_bad_job_file_is_named(text: str, message: str) -> None:
    with pytest.raises(JobFileError, match=message):
        parse_job_file(text, "/x/1.json")


def test_affinity_classes_on_the_pci_tree(tmp_path: Path) -> None:
    root = four_gpu_server(tmp_path)
    gpus, hcas = read_gpus(root), read_hcas(root)
    assert [g.address for g in gpus] == ["0000:19:00.0", "0000:1e:00.0", "0000:3a:00.0", "0000:9d:00.0"]
    assert [h.name for h in hcas] == ["mlx5_0", "mlx5_1"]
    table = [[relation(g, h) for h in hcas] for g in gpus]
    assert table == [["PIX", "SYS"], ["PXB", "SYS"], ["NODE", "SYS"], ["SYS", "PIX"]]
    got = [(a.gpu, a.hca, a.relation, a.numa_node) for a in read_affinity(root)]
    assert got == [(0, "mlx5_0", "PIX", 0), (1, "mlx5_0", "PXB", 0), (2, "mlx5_0", "NODE", 0), (3, "mlx5_1", "PIX", 1)]


class ListPids:
    """A runner answering as ``scontrol listpids`` does (the real command runs in test_jobs_slurm)."""

    def __init__(self, output: str, returncode: int = 0) -> None:
        self.output, self.returncode, self.calls = output, returncode, 0

    async def run(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult:
        self.calls += 1
        return CommandResult(self.output, self.returncode)


def _collector(tmp_path: Path, runner: ListPids, clock: list[float]) -> JobsCollector:
    options = {"jobs_dir": str(tmp_path / "jobs"), "proc_root": str(tmp_path / "proc"), "grace_seconds": 30}
    factories = JobsFactories(runner=lambda: runner, monotonic=lambda: clock[0], wall_clock=lambda: clock[0])
    c = build(
        "jobs",
        options,
        node="n1",
        sysfs_root=four_gpu_server(tmp_path / "sys"),
        registry=REGISTRY,
        factories=[factories],
    )
    assert isinstance(c, JobsCollector)
    return c


def _job_file(tmp_path: Path, job: str, gpus: str, mtime: float) -> Path:
    path = tmp_path / "jobs" / f"{job}.json"
    path.parent.mkdir(exist_ok=True)
    doc = {"version": 1, "scheduler": "slurm", "job_id": job, "user": "alice", "name": "train", "gpus": gpus}
    path.write_text(json.dumps({**doc, "nodelist": "n[1-2]", "partition": "gpu"}))
    os.utime(path, (mtime, mtime))
    return path


def _infos(readings: Sequence[object]) -> dict[str, dict[str, str]]:
    from fabricd.model import Reading

    return {r.device: dict(r.labels) for r in readings if isinstance(r, Reading) and r.source == "job" and r.device}


def test_collector_reports_checked_jobs_with_their_hcas(tmp_path: Path) -> None:
    clock = [10_000.0]
    runner = ListPids("PID JOBID STEPID LOCALID GLOBALID\n4242 11 0 0 0\n4343 12 0 0 0\n")
    (tmp_path / "proc" / "4242").mkdir(parents=True)  # job 12's process is gone: its file is stale
    _job_file(tmp_path, "11", "0,3", mtime=clock[0] - 100)
    _job_file(tmp_path, "12", "1", mtime=clock[0] - 100)
    _job_file(tmp_path, "13", "2", mtime=clock[0] - 5)  # just allocated: within the grace period
    (tmp_path / "jobs" / "14.json").write_text("{not json")
    c = _collector(tmp_path, runner, clock)
    readings = asyncio.run(c.collect())
    assert _infos(readings) == {
        "11": {"user": "alice", "name": "train", "scheduler": "slurm", "gpus": "0,3", "hcas": "mlx5_0,mlx5_1"},
        "13": {"user": "alice", "name": "train", "scheduler": "slurm", "gpus": "2", "hcas": "mlx5_0"},
    }
    gauges = {r.counter: r.value for r in readings if r.source == "job" and not r.device}
    assert gauges == {"running": 2.0, "files_invalid": 1.0, "files_stale": 1.0}
    # The next scrape within the verify interval does not run scontrol again.
    asyncio.run(c.collect())
    assert runner.calls == 1


def test_without_scontrol_the_files_are_trusted(tmp_path: Path) -> None:
    clock = [10_000.0]
    runner = ListPids("scontrol: error: slurm_load_node_info: Unable to contact slurm controller\n", 1)
    _job_file(tmp_path, "12", "", mtime=clock[0] - 1000)
    readings = asyncio.run(_collector(tmp_path, runner, clock).collect())
    assert _infos(readings) == {
        "12": {"user": "alice", "name": "train", "scheduler": "slurm", "gpus": "", "hcas": ""},
    }


def test_a_node_with_no_job_step_has_no_live_job_and_its_old_files_are_stale(tmp_path: Path) -> None:
    # Slurm's scontrol listpids exits 1 with "No job steps exist on this node." where nothing runs
    # (src/scontrol/info_job.c): that is an answer. Read as a failure, the files were trusted and a
    # node that crashed before its epilog kept reporting its last job.
    clock = [10_000.0]
    runner = ListPids("No job steps exist on this node.\n", 1)
    _job_file(tmp_path, "12", "1", mtime=clock[0] - 1000)  # the crashed job's
    _job_file(tmp_path, "13", "2", mtime=clock[0] - 5)  # just allocated: its first step not started yet
    readings = asyncio.run(_collector(tmp_path, runner, clock).collect())
    assert list(_infos(readings)) == ["13"]
    gauges = {r.counter: r.value for r in readings if r.source == "job" and not r.device}
    assert (gauges["running"], gauges["files_stale"]) == (1.0, 1.0)


def test_exposed_as_info_series(tmp_path: Path) -> None:
    clock = [10_000.0]
    _job_file(tmp_path, "11", "3", mtime=clock[0])
    readings = asyncio.run(_collector(tmp_path, ListPids("", 0), clock).collect())
    text = render([Sample(1.0, r) for r in readings], node="n1").decode()
    lines = sorted(line for line in text.splitlines() if line.startswith(("fabricd_job_info", "fabricd_gpu_nic")))
    assert lines == [
        'fabricd_gpu_nic_affinity_info{gpu="0",gpu_address="0000:19:00.0",hca="mlx5_0",node="n1",numa_node="0",'
        'path="PIX"} 1.0',
        'fabricd_gpu_nic_affinity_info{gpu="1",gpu_address="0000:1e:00.0",hca="mlx5_0",node="n1",numa_node="0",'
        'path="PXB"} 1.0',
        'fabricd_gpu_nic_affinity_info{gpu="2",gpu_address="0000:3a:00.0",hca="mlx5_0",node="n1",numa_node="0",'
        'path="NODE"} 1.0',
        'fabricd_gpu_nic_affinity_info{gpu="3",gpu_address="0000:9d:00.0",hca="mlx5_1",node="n1",numa_node="1",'
        'path="PIX"} 1.0',
        'fabricd_job_info{gpus="3",hcas="mlx5_1",job_id="11",name="train",node="n1",scheduler="slurm",user="alice"} '
        "1.0",
    ]
