"""A real single-node Slurm for tests: Debian's munged, slurmctld and slurmd in a temporary folder.

Everything (munge key and socket, slurm.conf, state, spool, logs, pid files) lives under the given
folder and the daemons listen on free ports, so a test cluster never touches /etc/slurm or a real
cluster. ``proctrack/linuxproc`` and ``task/none``: no cgroups are needed (containers, CI). The
prolog and epilog are ``deploy/slurm/``'s, run through wrappers that point them at the test's
jobs folder (slurmd gives a prolog only the SLURM_* variables, so the folder cannot come from the
daemon's environment).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from tests.helpers import REPO, need_binary, need_root
from tests.support.server import free_port


def _conf(root: Path, host: str, ports: tuple[int, int]) -> str:
    return f"""ClusterName=fabricdtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
Prolog={root}/prolog
Epilog={root}/epilog
PrologFlags=Alloc
GresTypes=gpu
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """``with SlurmCluster(tmp) as slurm:`` one controller and one compute node (this host)."""

    def __init__(self, root: Path) -> None:
        need_root()
        for tool in ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "squeue", "scancel", "sinfo"):
            need_binary(tool)
        self.root, self.host = root, socket.gethostname().split(".")[0]
        self.jobs_dir = root / "jobs"
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.pids: list[Path] = []

    def __enter__(self) -> SlurmCluster:
        for sub in ("munge", "state", "spool", "log", "jobs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        for name in ("prolog", "epilog"):
            wrapper = self.root / name
            script = REPO / "deploy" / "slurm" / f"{name}.sh"
            wrapper.write_text(f"#!/bin/sh\nFABRICD_JOBS_DIR={self.jobs_dir} exec {script}\n")
            wrapper.chmod(0o755)
        self.conf.write_text(_conf(self.root, self.host, (free_port(), free_port())))
        # Four GPUs that are terminals: Slurm's own test suite fakes GPUs this way (no cgroups here
        # to constrain them); what matters is that slurmd hands out indices in SLURM_JOB_GPUS.
        (self.root / "gres.conf").write_text(f"NodeName={self.host} Name=gpu File=/dev/tty[0-3]\n")
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        m = self.root / "munge"
        self._daemon(
            "munged",
            "--force",
            f"--key-file={m / 'munge.key'}",
            f"--socket={m / 'socket'}",
            f"--pid-file={m / 'munged.pid'}",
            f"--log-file={self.root / 'log' / 'munged.log'}",
            f"--seed-file={m / 'munged.seed'}",
        )
        self.pids.append(m / "munged.pid")
        self._daemon("slurmctld", "-i")
        self.pids.append(self.root / "slurmctld.pid")
        self._daemon("slurmd")
        self.pids.append(self.root / "slurmd.pid")
        self.wait_until(lambda: "idle" in self.run("sinfo", "-h", "-o", "%T", check=False), "the node is idle")

    def _daemon(self, name: str, *args: str) -> None:
        subprocess.run([need_binary(name), *args], env=self.env, check=True, timeout=30, capture_output=True)

    def run(self, tool: str, *args: str, check: bool = True) -> str:
        if tool == "sbatch":  # its slurm-<id>.out goes to the test's folder, not the checkout
            args = (f"--chdir={self.root}", f"--output={self.root / 'log' / 'job-%j.out'}", *args)
        done = subprocess.run(
            [need_binary(tool), *args], env=self.env, check=check, timeout=30, capture_output=True, text=True
        )
        return done.stdout

    def wait_until(self, ready: object, what: str, timeout: float = 60.0) -> None:
        assert callable(ready)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.5)
        logs = "\n".join(p.read_text()[-2000:] for p in sorted((self.root / "log").glob("*.log")))
        raise AssertionError(f"Slurm: {what} did not happen within {timeout:.0f} s\n{logs}")

    def __exit__(self, *_: object) -> None:
        if self.pids:  # leave no job behind: cancel this cluster's jobs before stopping its daemons
            self.run("scancel", "--user=root", "--full", check=False)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.run("squeue", "-h", check=False).strip():
                time.sleep(0.5)
        for pid_file in reversed(self.pids):  # slurmd, slurmctld, then munged: the ones started here
            try:
                pid = int(pid_file.read_text().strip())
                os.kill(pid, 15)
            except (OSError, ValueError):
                continue
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
        self.pids.clear()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
