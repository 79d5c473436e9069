"""Jobs in the simulator: a scenario places them, ``fabricd eval`` scores which jobs incidents name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fabricd.jobmap import affected_jobs, footprint
from fabricd.model import AffectedJob, Incident, IncidentKind, IncidentState, Severity
from fabricd.sim import eval as sim_eval
from fabricd.sim.jobs import expected_jobs, job_metrics, placements, score_jobs
from fabricd.sim.scenario import ScenarioError, load, parse
from fabricd.sim.truth import Truth


def test_a_leaf_spine_fault_names_exactly_the_jobs_whose_traffic_crosses_it(tmp_path: Path) -> None:
    scenario = load("congestion-ib")
    run = asyncio.run(sim_eval.replay(scenario, tmp_path))
    result = sim_eval.score(scenario.name, scenario.interval, run.truths, run.seen)
    (truth,) = run.truths
    topo = scenario.build_topology()
    jobs = placements(scenario, sim_eval.EPOCH)
    assert expected_jobs(truth, topo, jobs) == {"102"}
    _first, inc = result.matches[truth.index][0]
    assert inc.element == "leaf-03~spine-02"
    fps = {j.job_id: footprint(topo, j.nodes) for j in jobs}
    assert affected_jobs(inc.element, inc.started_ts, inc.updated_ts, jobs, fps) == [
        AffectedJob("102", "bob", "finetune", ("node-011", "node-012", "node-013", "node-014"))
    ]
    counts = score_jobs(scenario, topo, sim_eval.EPOCH, run.truths, result.matches, result.false_positives)
    assert counts == {"attributed": 1, "correct": 1, "expected": 1, "found": 1}
    # What fabricd eval prints (--json and the table).
    result.jobs = counts
    rep = sim_eval.report([result])
    assert (rep["job_precision"], rep["job_recall"]) == (1.0, 1.0)
    assert rep["scenarios"]["congestion-ib"]["job_counts"] == counts
    assert sim_eval.render_text(rep).splitlines()[-1] == "job attribution: precision 1.00, recall 1.00"


def _incident(element: str, start: float, end: float) -> Incident:
    return Incident("k", IncidentKind.CONGESTION, Severity.WARNING, IncidentState.OPEN, element, "", start, end)


def test_a_mislocalized_incident_costs_job_precision_and_recall() -> None:
    scenario = load("congestion-ib")
    topo = scenario.build_topology()
    (truth,) = _truths()
    start = truth.start_ts + 30
    # Blamed on leaf-02~spine-02: names 103 and 105 (their traffic leaves leaf-02), not 102.
    wrong = {truth.index: [(start, _incident("leaf-02~spine-02", start, start + 60))]}
    counts = score_jobs(scenario, topo, sim_eval.EPOCH, [truth], wrong, [])
    assert counts == {"attributed": 2, "correct": 0, "expected": 1, "found": 0}
    assert job_metrics(counts) == {"job_precision": 0.0, "job_recall": 0.0}
    fp = [{"element": "node-009", "first_ts": start}]  # a false positive on node-009: jobs 101 and 104
    counts = score_jobs(scenario, topo, sim_eval.EPOCH, [truth], {}, fp)
    assert counts == {"attributed": 2, "correct": 0, "expected": 1, "found": 0}


def _truths() -> list[Truth]:
    return [
        Truth(
            0,
            "congestion",
            "leaf-03~spine-02",
            0.6,
            sim_eval.EPOCH + 120,
            sim_eval.EPOCH + 360,
            0.0,
            ("leaf-03~spine-02",),
            ("leaf-03~spine-02",),
        )
    ]


@pytest.mark.parametrize(
    ("jobs", "message"),
    [
        ([{"id": "1", "nodes": "node-[001-099]"}], "jobs[0].nodes: 'node-017' is not a node"),
        ([{"id": "1", "nodes": "node-[0a]"}], "jobs.0.nodes: Value error, nodelist: '0a' in 'node-[0a]'"),
        ([{"id": "1", "nodes": "node-001"}, {"id": "1", "nodes": "node-002"}], "jobs[1].id: '1' is already jobs[0]"),
    ],
)
def test_bad_job_placements_are_refused_by_name(jobs: list[dict[str, str]], message: str) -> None:
    doc = {"name": "x", "duration": "1m", "interval": "10s", "topology": {"nodes": 16}, "jobs": jobs}
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse(doc, "x.yaml")
