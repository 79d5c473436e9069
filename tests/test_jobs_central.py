"""The join at the central: jobs from the agents' batches, their footprint, incidents that name them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from collectors.inspector import record_readings
from fabricd.hooks.payload import Notification, webhook_body
from fabricd.inspector_parse import CollRecord
from fabricd.jobmap import JobPlacement, affected_jobs, footprint
from fabricd.model import AffectedJob, Incident, IncidentKind, IncidentState, Kind, Reading, Sample, Severity
from fabricd.server.app import create_app
from fabricd.server.jobreports import split_jobs
from fabricd.settings import ServerSettings
from fabricd.topology import fat_tree, to_doc
from fabricd.tuner import expected
from tests.helpers import skip_or_fail
from tests.support.detectors import ImmediateDetector
from tests.support.server import backend_url, encoded, ib_sample, make_batch, pg_reachable, running
from tests.test_catalogue import assert_catalogued

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
# 8 nodes, one HCA each, 4 per leaf (leaf-01: node-001..004, leaf-02: node-005..008), 2 spines.
TOPO = fat_tree(8, 1, 4, 2)
T0 = 1_800_000_000.0


def job_samples(ts: float, jobs: Sequence[tuple[str, str, str]], running: int | None = None) -> list[Sample]:
    """What the jobs collector sends at one scrape: (job id, user, hcas) per job, and the count."""
    out = []
    for job_id, user, hcas in jobs:
        labels = (("gpus", "0"), ("hcas", hcas), ("name", f"train-{job_id}"), ("scheduler", "slurm"), ("user", user))
        out.append(Sample(ts, Reading("job", job_id, "", "info", 1.0, "", Kind.INFO, labels, "info", 0)))
    count = len(jobs) if running is None else running
    out.append(Sample(ts, Reading("job", "", "", "running", float(count), "", Kind.GAUGE, (), "running", 0)))
    return out


def test_one_leaf_job_crosses_no_spine_and_two_leaf_job_crosses_every_uplink() -> None:
    one_leaf = footprint(TOPO, {"node-001": (), "node-002": ()})
    assert sorted(one_leaf.elements) == [
        "leaf-01",
        "node-001",
        "node-001/mlx5_0",
        "node-001/mlx5_0~leaf-01",
        "node-002",
        "node-002/mlx5_0",
        "node-002/mlx5_0~leaf-01",
    ]
    two_leaves = footprint(TOPO, {"node-003": ("mlx5_0",), "node-004": (), "node-005": ()})
    fabric = sorted(e for e in two_leaves.elements if e.startswith(("leaf", "spine")))
    assert fabric == [
        "leaf-01",
        "leaf-01~spine-01",
        "leaf-01~spine-02",
        "leaf-02",
        "leaf-02~spine-01",
        "leaf-02~spine-02",
        "spine-01",
        "spine-02",
    ]
    jobs = [
        JobPlacement("7", "alice", "a", "slurm", {"node-001": (), "node-002": ()}, T0, T0 + 60),
        JobPlacement("8", "bob", "b", "slurm", {"node-003": (), "node-004": (), "node-005": ()}, T0, T0 + 60),
        JobPlacement("9", "carol", "c", "slurm", {"node-006": (), "node-007": ()}, T0 - 600, T0 - 300, T0 - 300),
    ]
    fps = {j.job_id: footprint(TOPO, j.nodes) for j in jobs}
    assert affected_jobs("leaf-02~spine-01", T0, T0 + 30, jobs, fps) == [
        AffectedJob("8", "bob", "b", ("node-003", "node-004", "node-005"))
    ]
    assert affected_jobs("node-002/mlx5_0~leaf-01", T0, T0 + 30, jobs, fps) == [
        AffectedJob("7", "alice", "a", ("node-002",))
    ]
    # Job 9 crossed leaf-02 but had ended before the incident started.
    assert affected_jobs("leaf-02", T0, T0 + 30, jobs, fps) == [
        AffectedJob("8", "bob", "b", ("node-003", "node-004", "node-005"))
    ]


def test_job_readings_are_taken_out_of_the_batch() -> None:
    samples = [ib_sample(T0), *job_samples(T0, [("7", "alice", "mlx5_0")]), *job_samples(T0 + 10, [], running=2)]
    reports, rest = split_jobs(make_batch("node-001", "b1", samples))
    assert [(r.ts, [j.job_id for j in r.jobs], r.complete) for r in reports] == [
        (T0, ["7"], True),
        (T0 + 10, [], False),
    ]
    assert reports[0].jobs[0].hcas == "mlx5_0" and reports[0].jobs[0].user == "alice"
    assert [(s.reading.source, s.reading.counter) for s in rest.samples] == [
        ("infiniband", "port_xmit_data"),
        ("job", "running"),
        ("job", "running"),
    ]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres" and not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    with backend_url(request.param, tmp_path) as url:
        yield url


class LinkFault(ImmediateDetector):
    """A detector that finds one fault on a leaf-spine link once samples arrive (the detectors have
    their own tests; here it is the join that is under test)."""

    def __init__(self, *_: object) -> None:
        pass

    def process(self, samples: Sequence[tuple[str, Sample]]) -> list[Incident]:
        ts = [s.ts for _, s in samples if s.reading.source == "infiniband"]
        if not ts:
            return []
        return [
            Incident(
                key="congestion:leaf-02~spine-01",
                kind=IncidentKind.CONGESTION,
                severity=Severity.WARNING,
                state=IncidentState.OPEN,
                element="leaf-02~spine-01",
                summary="xmit wait on leaf-02 uplink to spine-01",
                started_ts=min(ts),
                updated_ts=max(ts),
            )
        ]


async def _ingest(client: httpx.AsyncClient, node: str, batch_id: str, samples: list[Sample]) -> None:
    body, headers = encoded(make_batch(node, batch_id, samples))
    resp = await client.post("/api/v1/ingest", content=body, headers=headers)
    assert resp.status_code == 200, resp.text


@pytest.fixture
async def client(db_url: str, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, list[Incident]]]:
    heard: list[Incident] = []
    settings = ServerSettings(db=db_url, data_dir=tmp_path / "data", auth=False, detection_interval_seconds=0.05)
    app = create_app(settings, LinkFault, incident_listeners=[lambda _i, _t, inc: heard.append(inc)])
    async with running(app) as c:
        c.store = app.state.services.store  # type: ignore[attr-defined]  # the test reaches the store's roles
        assert (await c.put("/api/v1/topology", json=to_doc(TOPO))).status_code == 200
        yield c, heard


async def _wait_for_incident(c: httpx.AsyncClient) -> dict[str, object]:
    for _ in range(200):
        rows = (await c.get("/api/v1/incidents")).json()
        if rows:
            detail: dict[str, object] = (await c.get(f"/api/v1/incidents/{rows[0]['id']}")).json()
            return detail
        await asyncio.sleep(0.05)
    raise AssertionError("no incident")


async def test_jobs_listed_joined_with_incidents_and_ended(client: tuple[httpx.AsyncClient, list[Incident]]) -> None:
    c, heard = client
    # Job 7 runs on leaf-01 only; job 8 on both leaves (node-004 and node-005).
    await _ingest(c, "node-001", "a1", job_samples(T0, [("7", "alice", "")]))
    await _ingest(c, "node-002", "b1", job_samples(T0, [("7", "alice", "")]))
    await _ingest(c, "node-004", "c1", job_samples(T0, [("8", "bob", "mlx5_0")]))
    await _ingest(c, "node-005", "d1", job_samples(T0, [("8", "bob", "mlx5_0")]))
    jobs = (await c.get("/api/v1/jobs")).json()
    assert [(j["id"], j["user"], j["name"], j["nodes"], j["ended_ts"]) for j in jobs] == [
        ("7", "alice", "train-7", ["node-001", "node-002"], None),
        ("8", "bob", "train-8", ["node-004", "node-005"], None),
    ]
    # The fault on leaf-02~spine-01 hurts job 8 (its traffic between the leaves), not job 7.
    await _ingest(c, "node-005", "d2", [ib_sample(T0 + 5)])
    inc = await _wait_for_incident(c)
    assert inc["affected_jobs"] == [{"id": "8", "user": "bob", "name": "train-8", "nodes": ["node-004", "node-005"]}]
    assert [i["id"] for i in (await c.get("/api/v1/incidents", params={"job": "8"})).json()] == [inc["id"]]
    assert (await c.get("/api/v1/incidents", params={"job": "7"})).json() == []
    body = webhook_body(Notification(str(inc["id"]), heard[-1], IncidentState.OPEN), "http://fabricd")
    assert body["incident"]["affected_jobs"] == inc["affected_jobs"]
    report = (await c.get(f"/api/v1/incidents/{inc['id']}/report")).text
    section = report.split("<h4>Affected jobs</h4>\n", 1)[1].split("\n", 1)[0]
    assert section == (
        "<table><thead><tr><th>job</th><th>user</th><th>name</th><th>nodes hit</th></tr></thead><tbody>"
        "<tr><td>8</td><td>bob</td><td>train-8</td><td>node-004 node-005</td></tr></tbody></table>"
    )

    # Job 8's own NCCL performance (Inspector, one rank on node-004) shows on its page.
    rec = CollRecord("8", "0xabc", 3, 16, "node-004", "AllReduce", 9, 2**31, 0.041, 366e9, 418e9, 2)
    await _ingest(c, "node-004", "c3", [Sample(T0 + 6, r) for r in record_readings(rec)])
    one = (await c.get("/api/v1/jobs/8")).json()
    # Judged against NCCL's tuner model (2 nodes x 8 ranks, 1 HCA per node in TOPO): a ring, Simple.
    want = expected("AllReduce", 2**31, 16, 2, 1)
    assert want is not None and (want.algo, want.protocol) == ("ring", "Simple")
    assert [(n["node"], n["op"], n["labels"], n["values"]) for n in one["nccl"]] == [
        (
            "node-004",
            "AllReduce",
            {"comm": "0xabc", "job_id": "8", "rank": "3", "expected_algo": "ring/Simple"},
            {
                "exec_time_seconds": 0.041,
                "busbw_bytes_per_second": 366e9,
                "algbw_bytes_per_second": 418e9,
                "message_size_bytes": 2**31,
                "communicator_ranks": 16,
                "communicator_nodes": 2,
                "expected_exec_time_seconds": want.time_seconds,
                "slowdown_ratio": 0.041 / want.time_seconds,
            },
        )
    ]
    assert one["hcas"] == {"node-004": ["mlx5_0"], "node-005": ["mlx5_0"]}
    assert [e for e in one["elements"] if e.startswith("spine")] == ["spine-01", "spine-02"]
    assert [i["id"] for i in one["incidents"]] == [inc["id"]]
    assert (await c.get("/api/v1/jobs/7")).json()["incidents"] == []
    missing = await c.get("/api/v1/jobs/999")
    assert missing.status_code == 404 and missing.json()["message"] == "job '999' has not been reported by any agent"

    metrics = (await c.get("/metrics")).text
    assert sorted(line for line in metrics.splitlines() if line.startswith("fabricd_job_info")) == [
        'fabricd_job_info{hcas="",job_id="7",name="train-7",node="node-001",scheduler="slurm",user="alice"} 1.0',
        'fabricd_job_info{hcas="",job_id="7",name="train-7",node="node-002",scheduler="slurm",user="alice"} 1.0',
        'fabricd_job_info{hcas="mlx5_0",job_id="8",name="train-8",node="node-004",scheduler="slurm",user="bob"} 1.0',
        'fabricd_job_info{hcas="mlx5_0",job_id="8",name="train-8",node="node-005",scheduler="slurm",user="bob"} 1.0',
    ]
    # the central's bounded /metrics: job info from the jobs table; per-node job counts are the
    # agents' own series (Prometheus scrapes them there), not repeated by the central
    assert assert_catalogued(metrics) >= {"fabricd_job_info"}
    assert not any(line.startswith("fabricd_job_running") for line in metrics.splitlines())
    # No job ever became a series (cardinality): only the per-node count did.
    series = (await c.get("/api/v1/series", params={"source": "job"})).json()
    assert sorted({s["counter"] for s in series}) == ["running"]

    # Job 7's epilog ran on both nodes: their next scrapes name no job, and it leaves the list.
    await _ingest(c, "node-001", "a2", job_samples(T0 + 60, []))
    assert [j["id"] for j in (await c.get("/api/v1/jobs")).json()] == ["7", "8"]  # node-002 still runs it
    await _ingest(c, "node-002", "b2", job_samples(T0 + 60, []))
    assert [j["id"] for j in (await c.get("/api/v1/jobs")).json()] == ["8"]
    assert (await c.get("/api/v1/jobs/7")).json()["ended_ts"] == T0 + 60
    # Retention forgets ended jobs: job 7 ended at T0 + 60.
    store = c.store  # type: ignore[attr-defined]
    assert store.jobs.expire(T0 + 60) == 0 and store.jobs.expire(T0 + 61) == 2
    assert (await c.get("/api/v1/jobs/7")).status_code == 404
    # A retried batch is a no-op; a scrape split over batches (count != infos) ends nothing.
    await _ingest(c, "node-002", "b1", job_samples(T0, [("7", "alice", "")]))
    await _ingest(c, "node-004", "c2", job_samples(T0 + 60, [], running=1))
    assert [j["id"] for j in (await c.get("/api/v1/jobs")).json()] == ["8"]


def test_an_unchanged_node_is_written_at_most_once_a_minute(tmp_path: Path) -> None:
    from fabricd.server import db
    from fabricd.server.jobreports import JobReport, JobSeen
    from fabricd.server.store.storage import Storage

    engine = db.make_engine(f"sqlite:///{tmp_path / 'jobs.db'}")
    db.prepare(engine)
    jobs = Storage.open(engine).jobs
    seen = (JobSeen("7", "slurm", "alice", "a", "", ""),)
    for ts in (T0, T0 + 10, T0 + 50):
        jobs.record([JobReport("node-001", ts, seen, True)])
    assert jobs.get("7").last_ts == T0  # the same jobs within a minute: not written again
    jobs.record([JobReport("node-001", T0 + 61, seen, True)])
    assert jobs.get("7").last_ts == T0 + 61
    jobs.record([JobReport("node-001", T0 + 70, (), True)])  # a change is written at once
    assert jobs.get("7").ended_ts == T0 + 70
    engine.dispose()
