"""``/api/v1/jobs``: the jobs the agents report, and one job's nodes, HCAs, fabric, incidents and NCCL."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from fabricd.jobmap import footprint
from fabricd.perfmodel import Fabric
from fabricd.server.api_models import IncidentSummary, JobOut, JobSummary, NcclOut
from fabricd.server.deps import IncidentsDep, JobsDep, LatestDep, Reader, TopologyDep
from fabricd.server.errors import not_found
from fabricd.server.routes.common import AUTH_ERRORS, NOT_FOUND
from fabricd.server.store.records import NotFound
from fabricd.topology import Topology, from_doc
from fabricd.tuner import expected

router = APIRouter(tags=["jobs"])
JobId = Annotated[str, Path(min_length=1, max_length=128, description="the scheduler's job id")]
INSPECTOR = "inspector"  # the source of NCCL Inspector samples (per-job collective performance)


@router.get("/api/v1/jobs", response_model=list[JobSummary], responses=AUTH_ERRORS, summary="Running jobs")
def list_jobs(jobs: JobsDep, _who: Reader) -> list[JobSummary]:
    return [JobSummary.of(j) for j in jobs.running()]


@router.get(
    "/api/v1/jobs/{job_id:path}",
    response_model=JobOut,
    responses={**AUTH_ERRORS, **NOT_FOUND},
    summary="One job: its nodes and HCAs, the fabric elements it crosses, open incidents on them, its NCCL",
)
def get_job(
    jobs: JobsDep,
    incidents: IncidentsDep,
    topology: TopologyDep,
    latest: LatestDep,
    _who: Reader,
    job_id: JobId,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JobOut:
    try:
        job = jobs.get(job_id)
    except NotFound as exc:
        raise not_found(str(exc)) from exc
    topo = _topology(topology)
    fp = footprint(topo, job.nodes)
    elements = fp.elements | set(job.nodes)
    touching = [
        IncidentSummary.of(r)
        for state in ("open", "acked")
        for r in incidents.query(state=state, limit=1000)
        if r.element in elements or any(j.get("id") == job_id for j in r.affected_jobs)
    ]
    return JobOut(
        **JobSummary.fields_of(job),
        hcas={n: list(h) for n, h in sorted(job.nodes.items())},
        elements=sorted(elements),
        incidents=sorted(touching, key=lambda i: -i.started_ts)[:limit],
        nccl=_judged(_nccl(latest, job_id, sorted(job.nodes)), topo),
    )


def _topology(topology: TopologyDep) -> Topology:
    try:
        return from_doc(topology.get().doc)
    except NotFound:
        return Topology()


def _nccl(latest: LatestDep, job_id: str, nodes: list[str]) -> list[NcclOut]:
    """The job's per-rank collectives: NCCL Inspector samples carry the job id as a label."""
    out: dict[tuple[str, str, tuple[tuple[str, str], ...]], NcclOut] = {}
    for node in nodes:
        for _, s in latest.values(node=node, source=INSPECTOR):
            r = s.reading
            if dict(r.labels).get("job_id") != job_id:
                continue
            key = (node, r.device, r.labels)
            entry = out.setdefault(key, NcclOut(node=node, op=r.device, ts=s.ts, labels=dict(r.labels), values={}))
            entry.values[r.metric], entry.ts = r.value, max(entry.ts, s.ts)
    return sorted(out.values(), key=lambda x: (-x.ts, x.node, x.op, x.labels.get("rank", "")))


def _judged(entries: list[NcclOut], topo: Topology) -> list[NcclOut]:
    """Each rank's time against what NCCL's tuner model expects (fabricd.tuner): the expected time,
    measured / expected as ``slowdown_ratio`` (1 = as modelled), and the algorithm it would pick."""
    for e in entries:
        v = e.values
        ranks, nodes = int(v.get("communicator_ranks", 0)), int(v.get("communicator_nodes", 0))
        hcas = len(topo.nodes.get(e.node, [])) or Fabric.hcas_per_node
        choice = expected(e.op, v.get("message_size_bytes", 0.0), ranks, nodes, hcas)
        if choice is None or not v.get("exec_time_seconds"):
            continue
        v["expected_exec_time_seconds"] = choice.time_seconds
        v["slowdown_ratio"] = v["exec_time_seconds"] / choice.time_seconds
        e.labels["expected_algo"] = f"{choice.algo}/{choice.protocol}"
    return entries
