"""What a batch says about jobs: the agents' ``job`` info readings, taken out before storage.

The jobs collector (``collectors/jobs.py``) sends, per scrape, one ``info`` reading per job and a
``running`` gauge with how many there are. Info readings go to the jobs table (``store/jobs.py``),
not to ``series``: job churn must not grow the series table. A scrape whose ``running`` count
matches its info readings is complete: the jobs it does not name have left the node. A scrape
split over two batches is not complete in either, and ends nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fabricd.model import Batch, Kind, Sample
from fabricd.wire_columns import SampleColumns

SOURCE = "job"


@dataclass(frozen=True, slots=True)
class JobSeen:
    job_id: str
    scheduler: str
    user: str
    name: str
    gpus: str
    hcas: str


@dataclass(frozen=True, slots=True)
class JobReport:
    """The jobs one node's agent named at one scrape; ``complete``: no other job runs there."""

    node: str
    ts: float
    jobs: tuple[JobSeen, ...]
    complete: bool


def _is_job_info(s: Sample) -> bool:
    return s.reading.source == SOURCE and s.reading.kind is Kind.INFO


def _seen(s: Sample) -> JobSeen:
    labels = dict(s.reading.labels)
    return JobSeen(
        s.reading.device,
        labels.get("scheduler", ""),
        labels.get("user", ""),
        labels.get("name", ""),
        labels.get("gpus", ""),
        labels.get("hcas", ""),
    )


def split_jobs(batch: Batch) -> tuple[list[JobReport], Batch]:
    """The batch's job reports (by scrape time, oldest first), and the batch without job info readings."""
    samples = batch.samples
    if isinstance(samples, SampleColumns):  # decoded by ingest: the jobs' own samples alone are built
        if SOURCE not in samples.sources:
            return [], batch
        reports, _ = split_jobs(
            replace(batch, samples=samples.where(src == SOURCE for src in samples.source).samples())
        )
        info = [src == SOURCE and kind == Kind.INFO for src, kind in zip(samples.source, samples.kind, strict=True)]
        return reports, replace(batch, samples=samples.where(not i for i in info))
    if not any(s.reading.source == SOURCE for s in samples):
        return [], batch
    infos: dict[float, list[JobSeen]] = {}
    counts: dict[float, int] = {}
    rest = []
    for s in batch.samples:
        if _is_job_info(s):
            infos.setdefault(s.ts, []).append(_seen(s))
            continue
        if s.reading.source == SOURCE and s.reading.counter == "running":
            counts[s.ts] = int(s.reading.value)
        rest.append(s)
    reports = [
        JobReport(batch.node, ts, tuple(infos.get(ts, [])), counts.get(ts) == len(infos.get(ts, [])))
        for ts in sorted(set(infos) | set(counts))
    ]
    return reports, replace(batch, samples=rest)
