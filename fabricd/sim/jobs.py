"""Jobs in simulated scenarios: where they run, which jobs a fault hurts, and how well incidents say so.

The scenario's ``jobs:`` (``fabricd/sim/scenario.py``) become the placements the central would
have learnt from the agents. ``expected_jobs`` is the ground truth, from the fault's element alone
and independently of ``fabricd.jobmap``: a leaf-spine link carries the traffic between its leaf's
nodes and nodes on other leaves; a host link or HCA port carries its node's traffic to the job's
other nodes; a straggler slows every job on it. ``score_jobs`` attributes each incident with
``fabricd.jobmap`` (as the central does) and counts, for ``fabricd eval``:

- precision: of the jobs incidents named, those the matched fault really hurts (a false-positive
  incident's jobs all count against it);
- recall: of the jobs the faults hurt, those named by each fault's best incident (a missed fault
  names none).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fabricd.jobmap import Footprint, JobPlacement, affected_jobs, footprint
from fabricd.model import Incident
from fabricd.sim.scenario import Scenario
from fabricd.sim.truth import Truth
from fabricd.topology import Topology

JOB_COUNTS = ("attributed", "correct", "expected", "found")
Matches = Mapping[int, Sequence[tuple[float, Incident]]]


def placements(scenario: Scenario, epoch: float) -> list[JobPlacement]:
    out = []
    for job in scenario.jobs:
        end = epoch + (job.end if job.end is not None else scenario.duration)
        nodes = {n: () for n in job.nodes}
        out.append(JobPlacement(job.id, job.user, job.name, "sim", nodes, epoch + job.start, end, end))
    return out


def _leaves(topo: Topology, job: JobPlacement) -> set[str]:
    links = (topo.uplink(p) for n in job.nodes for p in topo.nodes.get(n, []))
    return {link.b for link in links if link is not None}


def expected_jobs(truth: Truth, topo: Topology, jobs: Sequence[JobPlacement]) -> set[str]:
    """The jobs the fault hurts (ground truth)."""
    running = [j for j in jobs if j.overlaps(truth.start_ts, truth.end_ts)]
    link = topo.links.get(truth.element)
    if link is not None and link.kind == "fabric":
        return {j.job_id for j in running if link.a in _leaves(topo, j) and len(_leaves(topo, j)) > 1}
    if truth.element in topo.nodes:
        return {j.job_id for j in running if truth.element in j.nodes}
    port = link.a if link is not None else truth.element
    node = topo.hca_ports[port].node if port in topo.hca_ports else ""
    return {j.job_id for j in running if node in j.nodes and len(j.nodes) > 1}


def _named(
    element: str, start: float, end: float, jobs: Sequence[JobPlacement], fps: Mapping[str, Footprint]
) -> set[str]:
    return {a.job_id for a in affected_jobs(element, start, end, jobs, fps)}


def score_jobs(
    scenario: Scenario,
    topo: Topology,
    epoch: float,
    truths: Sequence[Truth],
    matches: Matches,
    false_positives: Sequence[Mapping[str, Any]],
) -> dict[str, int]:
    """Counts for job attribution: attributed, correct (of those), expected, found (of those)."""
    jobs = placements(scenario, epoch)
    fps = {j.job_id: footprint(topo, j.nodes) for j in jobs}
    counts = dict.fromkeys(JOB_COUNTS, 0)
    for t in truths:
        expected = expected_jobs(t, topo, jobs)
        counts["expected"] += len(expected)
        found = sorted(matches.get(t.index, []), key=lambda x: x[0])
        best = next((f for f in found if f[1].element in t.correct), found[0] if found else None)
        for _first, inc in found:
            named = _named(inc.element, inc.started_ts, inc.updated_ts, jobs, fps)
            counts["attributed"] += len(named)
            counts["correct"] += len(named & expected)
        if best is not None:
            counts["found"] += len(
                _named(best[1].element, best[1].started_ts, best[1].updated_ts, jobs, fps) & expected
            )
    for fp in false_positives:
        counts["attributed"] += len(_named(str(fp["element"]), float(fp["first_ts"]), float(fp["first_ts"]), jobs, fps))
    return counts


def job_metrics(counts: Mapping[str, int]) -> dict[str, float]:
    return {
        "job_precision": counts["correct"] / counts["attributed"] if counts["attributed"] else 1.0,
        "job_recall": counts["found"] / counts["expected"] if counts["expected"] else 1.0,
    }
