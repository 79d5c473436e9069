"""Jobs collector: which jobs run on this node, on which GPUs, and which HCAs their traffic uses.

Sources (docs/jobs.md):

- Slurm: the files ``deploy/slurm/prolog.sh`` writes into ``jobs_dir`` (one ``<jobid>.json`` per
  job, removed by the epilog). Every ``verify_interval_seconds`` the files are checked against
  ``scontrol listpids`` and the running processes (``<proc_root>/<pid>``): a file whose job has no
  live process is stale (a node that crashed before its epilog) and is not reported, unless it is
  younger than ``grace_seconds`` (a job allocated with ``PrologFlags=Alloc`` whose first step has
  not started yet). Without ``scontrol`` the files are trusted, and that is logged once.
- Kubernetes: ``kubelet_socket``, the kubelet pod-resources API (``fabricd/podresources.py``): each
  pod that holds GPUs or RDMA devices is its job's share of this node. When the kubelet does not
  answer, the last answer stands (logged once): a kubelet restart must not end every job.

Readings: one ``fabricd_job_info`` per job (never a job label on other samples: cardinality),
``running`` (how many, so the central can tell that a job ended), and the GPU <-> HCA affinity
(``fabricd_gpu_nic_affinity_info``, ``fabricd/affinity.py``), re-read every ``affinity_rescan_seconds``.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from fabricd.affinity import Affinity, hcas_of, read_affinity
from fabricd.collector import CollectorContext, CollectorFactories, CollectorOptions
from fabricd.command import CommandRunner, SubprocessRunner
from fabricd.jobfiles import JobFileError, JobRecord, parse_job_file, parse_listpids
from fabricd.model import Kind, Reading, labels_of
from fabricd.podresources import DEFAULT_JOB_PATTERN, GrpcPodLister, PodLister, kube_jobs

log = logging.getLogger("fabricd.collectors.jobs")

SOURCE = "job"
AFFINITY_SOURCE = "gpu"
MAX_FILES = 1024  # a node runs a handful of jobs; more files than this is a broken epilog
# What scontrol listpids prints, exiting 1, on a node with no job step (Slurm's
# src/scontrol/info_job.c, _list_pids_all_jobs): an answer, not a failure.
NO_STEPS = "No job steps exist on this node."


class JobsOptions(CollectorOptions):
    jobs_dir: Path = Path("/run/fabricd/jobs")
    proc_root: Path = Path("/proc")
    # The listpids command (argv); null: trust the files as they are.
    scontrol: list[str] | None = Field(default_factory=lambda: ["scontrol", "listpids"], min_length=1)
    verify_interval_seconds: float = Field(default=60.0, ge=1)
    grace_seconds: float = Field(default=120.0, ge=0)
    timeout_seconds: float = Field(default=10.0, gt=0)
    affinity_rescan_seconds: float = Field(default=600.0, ge=1)
    kubelet_socket: Path | None = None  # /var/lib/kubelet/pod-resources/kubelet.sock
    job_pattern: str = DEFAULT_JOB_PATTERN  # the job's name in a pod's name (group "job")
    # Privacy (docs/jobs.md): user names as the scheduler gives them, a hash of them, or none.
    users: Literal["name", "hash", "omit"] = "name"

    @field_validator("job_pattern")
    @classmethod
    def _pattern(cls, value: str) -> str:
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from exc
        if "job" not in compiled.groupindex:
            raise ValueError("needs a group named job: (?P<job>...)")
        return value


@dataclass(frozen=True, slots=True)
class JobsFactories(CollectorFactories):
    runner: Callable[[], CommandRunner] = SubprocessRunner
    monotonic: Callable[[], float] = time.monotonic  # when a check is due
    wall_clock: Callable[[], float] = time.time  # against job files' mtimes
    kubelet: Callable[[Path], PodLister] = GrpcPodLister


def job_reading(job: JobRecord, hcas: Sequence[str]) -> Reading:
    labels = {"user": job.user, "name": job.name, "scheduler": job.scheduler}
    labels["gpus"] = ",".join(str(g) for g in job.gpus)
    labels["hcas"] = ",".join(hcas)
    if job.namespace:
        labels["namespace"], labels["pod"] = job.namespace, job.pod
    return Reading(SOURCE, job.job_id, "", "info", 1.0, "", Kind.INFO, labels_of(labels), "info", 0)


def affinity_reading(a: Affinity) -> Reading:
    labels = labels_of({"gpu_address": a.gpu_address, "hca": a.hca, "path": a.relation, "numa_node": str(a.numa_node)})
    return Reading(AFFINITY_SOURCE, str(a.gpu), "", "nic_affinity", 1.0, "", Kind.INFO, labels, "nic_affinity", 0)


def _gauge(counter: str, value: float) -> Reading:
    return Reading(SOURCE, "", "", counter, value, "", Kind.GAUGE, (), counter, 0)


def job_readings(jobs: Sequence[JobRecord], affinity: Sequence[Affinity]) -> list[Reading]:
    """What one scrape reports: each job with the HCAs it uses (its RDMA devices, else those its
    GPUs are nearest), the count, the affinity."""
    out = [job_reading(j, j.devices or hcas_of(j.gpus, affinity)) for j in jobs]
    out.append(_gauge("running", float(len(jobs))))
    out.extend(affinity_reading(a) for a in affinity)
    return out


class SlurmFiles:
    """The prolog's files, checked against ``scontrol listpids`` every verify interval."""

    def __init__(self, options: JobsOptions, factories: JobsFactories) -> None:
        self.options = options
        self.runner = factories.runner()
        self.monotonic, self.wall_clock = factories.monotonic, factories.wall_clock
        self.next_check = 0.0
        self.alive: set[str] | None = None  # None: never checked, or the check is unavailable
        self.logged: set[str] = set()
        self.invalid = 0
        self.stale = 0

    async def jobs(self) -> list[JobRecord]:
        found = self._read_files()
        if self.monotonic() >= self.next_check:
            self.next_check = self.monotonic() + self.options.verify_interval_seconds
            self.alive = await self._alive_jobs()
        now = self.wall_clock()
        kept = [job for job, mtime in found if self._running(job, now - mtime)]
        self.stale = len(found) - len(kept)
        return kept

    def _running(self, job: JobRecord, age_seconds: float) -> bool:
        return self.alive is None or job.job_id in self.alive or age_seconds < self.options.grace_seconds

    def _read_files(self) -> list[tuple[JobRecord, float]]:
        folder = self.options.jobs_dir
        paths = sorted(folder.glob("*.json"))[:MAX_FILES] if folder.is_dir() else []
        out, self.invalid = [], 0
        for path in paths:
            try:
                stat = path.stat()
                out.append((parse_job_file(path.read_text(errors="replace"), str(path)), stat.st_mtime))
            except FileNotFoundError:
                continue  # the epilog removed it between the listing and the read
            except (OSError, JobFileError) as exc:
                self.invalid += 1
                self._log_once(str(path), f"job file skipped: {exc}")
        return out

    async def _alive_jobs(self) -> set[str] | None:
        if self.options.scontrol is None:
            return None
        result = await self.runner.run(self.options.scontrol, self.options.timeout_seconds)
        if result.returncode != 0 and NO_STEPS in result.output:
            return set()  # no job runs a step here: files past their grace are stale, not trusted
        if result.returncode != 0:
            why = result.error or ("timed out" if result.timed_out else result.output.strip()[:200])
            self._log_once("scontrol", f"{' '.join(self.options.scontrol)} failed ({why}); job files are trusted")
            return None
        pids = parse_listpids(result.output)
        root = self.options.proc_root
        return {job for job, ps in pids.items() if any((root / str(p)).is_dir() for p in ps)}

    def _log_once(self, key: str, message: str) -> None:
        if key not in self.logged:
            self.logged.add(key)
            log.warning("%s", message)


class JobsCollector:
    name: ClassVar[str] = "jobs"
    Options: ClassVar[type[CollectorOptions]] = JobsOptions

    def __init__(self, ctx: CollectorContext) -> None:
        assert isinstance(ctx.options, JobsOptions)
        self.options = ctx.options
        self.sysfs_root = ctx.sysfs_root
        factories = ctx.factories_for(JobsFactories)
        self.monotonic = factories.monotonic
        self.slurm = SlurmFiles(self.options, factories)
        self.kubelet = factories.kubelet(self.options.kubelet_socket) if self.options.kubelet_socket else None
        self.pods: list[JobRecord] = []
        self.affinity: list[Affinity] = []
        self.next_affinity = 0.0

    async def collect(self) -> Sequence[Reading]:
        if self.monotonic() >= self.next_affinity:
            self.next_affinity = self.monotonic() + self.options.affinity_rescan_seconds
            self.affinity = read_affinity(self.sysfs_root)
        jobs = await self.slurm.jobs()
        if self.kubelet is not None:
            jobs += await self._pods()
        out = job_readings([_private(j, self.options.users) for j in jobs], self.affinity)
        out.append(_gauge("files_invalid", float(self.slurm.invalid)))
        out.append(_gauge("files_stale", float(self.slurm.stale)))
        return out

    async def _pods(self) -> list[JobRecord]:
        assert self.kubelet is not None
        try:
            raw = await self.kubelet.list(self.options.timeout_seconds)
            self.pods = kube_jobs(raw, self.options.job_pattern, self.sysfs_root, self.options.proc_root, self.affinity)
        except Exception as exc:  # the last answer stands; the scrape goes on
            self.slurm._log_once("kubelet", f"kubelet pod-resources List failed ({exc}); keeping the last answer")
        return list(self.pods)

    async def close(self) -> None:
        if self.kubelet is not None:
            await self.kubelet.close()


def _private(job: JobRecord, users: str) -> JobRecord:
    if users == "name" or not job.user:
        return job
    hidden = "" if users == "omit" else hashlib.sha256(job.user.encode()).hexdigest()[:12]
    return replace(job, user=hidden)
