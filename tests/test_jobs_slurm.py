"""Real Slurm: jobs started with ``sbatch`` show in ``fabricd jobs`` with their node and the HCAs their
GPUs use (``--gres=gpu:N``: slurmd's ``SLURM_JOB_GPUS``), and leave it when they end.

Debian's slurmctld, slurmd and munge (deploy/install-system-deps.sh) run a one-node cluster in a
temporary folder (tests/support/slurm.py) whose prolog and epilog are deploy/slurm/'s; a real
``fabricd agent`` with the jobs collector and a real ``fabricd server`` process are the rest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.pcitree import four_gpu_server
from tests.support.server import ServerProcess
from tests.support.slurm import SlurmCluster

AGENT_INTERVAL = "1"


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmCluster]:
    with SlurmCluster(tmp_path / "slurm") as cluster:
        yield cluster


def fabricd_jobs(server: ServerProcess, *job: str) -> Any:
    out = subprocess.run(
        [sys.executable, "-m", "fabricd", "jobs", *job, "--server", server.url, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(out.stdout)


def test_prolog_file_and_listpids_of_a_running_job(slurm: SlurmCluster) -> None:
    job = slurm.run("sbatch", "--parsable", "--job-name=allreduce", "--gres=gpu:2", "--wrap", "sleep 60").strip()
    slurm.wait_until(lambda: (slurm.jobs_dir / f"{job}.json").exists(), "the prolog wrote the job file")
    doc = json.loads((slurm.jobs_dir / f"{job}.json").read_text())
    # slurmd's prolog does not get the job name (Slurm sets SLURM_JOB_NAME in PrologSlurmctld only).
    assert doc == {
        "version": 1,
        "scheduler": "slurm",
        "job_id": job,
        "user": "root",
        "name": "",
        "nodelist": slurm.host,
        "gpus": "0,1",  # SLURM_JOB_GPUS: slurmd's indices of the GPUs it gave the job
        "partition": "debug",
    }
    # Exit 1 and "No job steps exist on this node." until the batch step starts (PrologFlags=Alloc
    # runs the prolog at allocation, before it).
    listed = lambda: job in slurm.run("scontrol", "listpids", check=False).split()  # noqa: E731
    slurm.wait_until(listed, "scontrol listpids shows the job")
    slurm.run("scancel", job)
    slurm.wait_until(lambda: not (slurm.jobs_dir / f"{job}.json").exists(), "the epilog removed the job file")


def test_sbatch_job_is_listed_within_60_s_and_leaves_when_it_ends(slurm: SlurmCluster, tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "central", auth=False).start()
    config = tmp_path / "agent.yaml"
    options = {"jobs_dir": str(slurm.jobs_dir), "verify_interval_seconds": 5}
    config.write_text(yaml.safe_dump({"collectors": {"jobs": options}}))
    transport = {"FABRICD_TRANSPORT__BATCH_MAX_SECONDS": "1", "SLURM_CONF": str(slurm.conf)}
    agent_args = [sys.executable, "-m", "fabricd", "agent", "-c", str(config), "--central", server.url]
    agent_args += ["--node", slurm.host, "--interval", AGENT_INTERVAL, "--data-dir", str(tmp_path / "agent")]
    # The node's PCIe tree: GPU 0 and mlx5_0 share a switch, GPU 3 and mlx5_1 (tests/support/pcitree.py).
    agent_args += ["--sysfs-root", str(four_gpu_server(tmp_path / "sys"))]
    log = (tmp_path / "agent.log").open("wb")
    agent = subprocess.Popen(agent_args, stdout=log, stderr=subprocess.STDOUT, env={**slurm.env, **transport})
    try:
        one = slurm.run("sbatch", "--parsable", "--gres=gpu:1", "--wrap", "sleep 120").strip()
        three = slurm.run("sbatch", "--parsable", "--gres=gpu:3", "--wrap", "sleep 120").strip()

        def listed() -> list[str]:
            return [j["id"] for j in fabricd_jobs(server)]

        slurm.wait_until(lambda: listed() == [one, three], "fabricd jobs lists both within 60 s")
        jobs = fabricd_jobs(server)
        assert [(j["user"], j["scheduler"], j["nodes"]) for j in jobs] == [("root", "slurm", [slurm.host])] * 2
        # GPU 0 sends through mlx5_0; GPUs 1-3 through mlx5_0 (PXB, NODE) and mlx5_1 (PIX).
        assert fabricd_jobs(server, one)["hcas"] == {slurm.host: ["mlx5_0"]}
        assert fabricd_jobs(server, three)["hcas"] == {slurm.host: ["mlx5_0", "mlx5_1"]}
        slurm.run("scancel", one)
        slurm.wait_until(lambda: listed() == [three], "the ended job leaves fabricd jobs")
    finally:
        agent.terminate()
        agent.wait(timeout=15)
        log.close()
        server.stop()
