"""The central's REST API and ingest, end to end in-process, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text

from fabricd import wire
from fabricd.model import CollectorHealth, Incident, IncidentKind, IncidentState, Kind, Sample, Severity
from fabricd.server.app import create_app
from fabricd.server.services import Services
from fabricd.server.store.storage import Storage
from fabricd.settings import LimitSettings, ServerSettings
from fabricd.topology import fat_tree, to_doc
from tests.helpers import skip_or_fail
from tests.support.points import written_latest
from tests.support.server import backend_url, encoded, ib_sample, make_batch, pg_reachable, running

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres" and not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    with backend_url(request.param, tmp_path) as url:
        yield url


def settings_for(db_url: str, tmp_path: Path, **kw: Any) -> ServerSettings:
    return ServerSettings(db=db_url, data_dir=tmp_path / "data", token_cache_seconds=0, **kw)


class Api:
    """An in-process client plus tokens of each role."""

    def __init__(self, client: httpx.AsyncClient, app: FastAPI) -> None:
        self.client, self.app = client, app
        self.svc: Services = app.state.services
        now = time.time()
        self.admin = self.svc.store.tokens.create("admin", now, note="test admin")[1]
        self.read = self.svc.store.tokens.create("read", now)[1]
        self.agent = self.svc.store.tokens.create("agent", now, node="node-a")[1]

    @property
    def store(self) -> Storage:
        return self.svc.store

    def auth(self, token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def get(self, path: str, token: str | None = "read", **params: Any) -> httpx.Response:
        return await self.client.get(path, params=params, headers=self.auth(self._tok(token)))

    async def post(self, path: str, token: str | None = "admin", **kw: Any) -> httpx.Response:
        return await self.client.post(path, headers=self.auth(self._tok(token)), **kw)

    def _tok(self, token: str | None) -> str | None:
        return {"read": self.read, "admin": self.admin, "agent": self.agent}.get(token or "", token)

    async def ingest(
        self,
        node: str,
        batch_id: str,
        samples: list[Sample],
        token: str | None = "admin",
        content_type: str = wire.MSGPACK,
        gzip: bool = True,
    ) -> httpx.Response:
        body, headers = encoded(make_batch(node, batch_id, samples), content_type, gzip)
        return await self.client.post(
            "/api/v1/ingest", content=body, headers={**headers, **self.auth(self._tok(token))}
        )


@pytest.fixture
async def api(db_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    app = create_app(settings_for(db_url, tmp_path))
    async with running(app) as client:
        yield Api(client, app)


def stored_points(api: Api) -> int:
    return sum(len(api.store.inventory.points(s.id, 0, 1e12)) for s in api.store.inventory.find_series(limit=1000))


def port_samples(ts: float, tx: float, rx: float, pause: float = 0.0, wait: float = 0.0) -> list[Sample]:
    return [
        ib_sample(ts, rate=tx),
        ib_sample(ts, counter="port_rcv_data", name="port_receive_data", rate=rx),
        ib_sample(ts, counter="port_xmit_wait", name="port_transmit_wait", unit="ticks", rate=wait),
        ib_sample(ts, counter="port_rcv_errors", name="port_receive_errors", unit="", rate=0.5),
        ib_sample(
            ts, counter="rate", name="link_rate", unit="bytes_per_second", value=50e9, kind=Kind.GAUGE, rate=None
        ),
        ib_sample(
            ts,
            counter="port_info",
            name="port_info",
            unit="",
            kind=Kind.INFO,
            value=1.0,
            rate=None,
            labels=(("link_layer", "InfiniBand"), ("state", "ACTIVE")),
        ),
    ]


# ---- ingest ---------------------------------------------------------------------------------------


@pytest.fixture
async def fleet_api(db_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    """As ``api``, with the opt-in fleet view on /metrics (``metrics_fleet_view``)."""
    app = create_app(settings_for(db_url, tmp_path, metrics_fleet_view=True))
    async with running(app) as client:
        yield Api(client, app)


@pytest.mark.parametrize("content_type,gzip", [(wire.MSGPACK, True), (wire.JSON, False), (wire.JSON, True)])
async def test_ingest_accepts_every_encoding_and_shows_in_metrics(
    fleet_api: Api, content_type: str, gzip: bool
) -> None:
    api = fleet_api
    resp = await api.ingest("node-a", "b1", port_samples(time.time(), 2e9, 1e9), "agent", content_type, gzip)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"batch_id": "b1", "accepted": 6, "duplicate": False}
    text = (await api.client.get("/metrics")).text
    assert (
        'fabricd_infiniband_port_transmit_data_bytes_per_second{device="mlx5_0",node="node-a",port="1"} 2e+09' in text
    )
    assert 'fabricd_collector_success{collector="infiniband",node="node-a"} 1.0' in text
    assert "fabricd_ingest_samples_total 6.0" in text


async def test_retried_batch_is_acknowledged_and_not_stored_twice(api: Api) -> None:
    samples = port_samples(time.time(), 2e9, 1e9)
    first = await api.ingest("node-a", "batch-7", samples)
    again = await api.ingest("node-a", "batch-7", samples)
    assert first.json()["duplicate"] is False
    assert again.status_code == 200 and again.json() == {"batch_id": "batch-7", "accepted": 0, "duplicate": True}
    assert stored_points(api) == len(samples)
    node = (await api.get("/api/v1/nodes/node-a")).json()
    assert node["batches"] == 1 and node["samples"] == len(samples)
    assert "fabricd_ingest_duplicate_batches_total 1.0" in (await api.client.get("/metrics")).text
    # The same batch id from another node is a different batch.
    assert (await api.ingest("node-b", "batch-7", samples)).json()["duplicate"] is False


async def _post_raw(api: Api, body: bytes, content_type: str, **headers: str) -> httpx.Response:
    return await api.client.post(
        "/api/v1/ingest", content=body, headers={"Content-Type": content_type, **api.auth(api.admin), **headers}
    )


async def test_bad_bodies_get_errors_that_name_the_problem(api: Api) -> None:
    batch = wire.batch_to_obj(make_batch("node-a", "x", [ib_sample(time.time())]), version=2)
    columns = wire.batch_to_obj(make_batch("node-a", "y", [ib_sample(time.time())]))  # this release's: 3
    cases: list[tuple[bytes, str, dict[str, str], int, str, str]] = [
        (b"{not json", wire.JSON, {}, 400, "bad_body", "not valid"),
        (b"hello", "text/plain", {}, 415, "unsupported_media_type", "application/msgpack"),
        (b"{}", wire.JSON, {"Content-Encoding": "br"}, 415, "unsupported_media_type", "gzip"),
        (b"\x1f\x8b garbage", wire.JSON, {"Content-Encoding": "gzip"}, 400, "bad_body", "gzip"),
        (_json({**batch, "v": 99}), wire.JSON, {}, 422, "unsupported_schema_version", "version 99"),
        (_json({**batch, "samples": [[1.0, "x"]]}), wire.JSON, {}, 422, "invalid_field", "samples[0]"),
        (
            _json({**columns, "columns": {**columns["columns"], "device": [99]}}),
            wire.JSON,
            {},
            422,
            "invalid_field",
            "columns.device[0] must be an index into 'strings'",
        ),
    ]
    for body, ctype, headers, status, code, words in cases:
        resp = await _post_raw(api, body, ctype, **headers)
        assert resp.status_code == status, (code, resp.text)
        assert resp.json()["error"] == code and words in resp.json()["message"]
    assert stored_points(api) == 0
    metrics = (await api.client.get("/metrics")).text
    assert 'fabricd_ingest_rejected_batches_total{reason="unsupported_schema_version"} 1.0' in metrics


def _json(obj: Any) -> bytes:
    import json

    return json.dumps(obj).encode()


async def test_limits_refuse_with_the_limit_named(db_url: str, tmp_path: Path) -> None:
    limits = LimitSettings(
        max_body_bytes=20_000, max_samples_per_batch=50, max_label_value_length=16, max_series_per_node=8
    )
    app = create_app(settings_for(db_url, tmp_path, limits=limits))
    async with running(app) as client:
        api = Api(client, app)
        now = time.time()
        big = [ib_sample(now, device=f"mlx5_{i}") for i in range(500)]
        resp = await api.ingest("node-a", "big", big, gzip=False)
        assert resp.status_code == 413 and "max_body_bytes" in resp.json()["message"]
        many = [ib_sample(now + i) for i in range(60)]
        resp = await api.ingest("node-a", "many", many)
        assert resp.status_code == 413 and "max_samples_per_batch=50" in resp.json()["message"]
        resp = await api.ingest("node-a", "long", [ib_sample(now, device="d" * 17)])
        assert resp.status_code == 422 and resp.json()["field"] == "samples[0].device"
        assert "max_label_value_length=16" in resp.json()["message"]
        ok = await api.ingest("node-a", "five", [ib_sample(now, device=f"mlx5_{i}") for i in range(5)])
        assert ok.status_code == 200
        over = await api.ingest("node-a", "over", [ib_sample(now, device=f"mlx5_{i}") for i in range(10)])
        assert over.status_code == 429 and over.headers["Retry-After"].isdigit()
        assert over.json()["error"] == "series_limit" and "max_series_per_node" in over.json()["message"]
        # All or nothing: the known series of the refused batch were not stored either.
        assert stored_points(api) == 5
        # Another node has its own budget.
        assert (await api.ingest("node-b", "b", [ib_sample(now, device=f"x{i}") for i in range(8)])).status_code == 200


# ---- auth -----------------------------------------------------------------------------------------


async def test_auth_failures_store_nothing(api: Api) -> None:
    samples = [ib_sample(time.time())]
    cases = [(None, 401), ("fabricd_not-a-real-token", 401), ("agent", 403), ("read", 403)]
    for token, status in cases:
        node = "node-b" if token == "agent" else "node-a"  # the agent token is bound to node-a
        resp = await api.ingest(node, f"b-{token}", samples, token=token)
        assert resp.status_code == status, (token, resp.text)
        assert resp.json()["error"] in ("unauthorized", "forbidden") and resp.json()["message"]
        if status == 401:
            assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert (await api.get("/api/v1/nodes")).json() == []
    assert stored_points(api) == 0
    assert (await api.ingest("node-a", "ok", samples, token="agent")).status_code == 200


async def test_roles_guard_the_api(api: Api) -> None:
    inc_id, _ = api.store.incidents.upsert(incident("k1"))
    assert (await api.get("/api/v1/incidents", token=None)).status_code == 401
    assert (await api.get("/api/v1/incidents", token="agent")).status_code == 403
    resp = await api.post(f"/api/v1/incidents/{inc_id}/ack", token="read")
    assert resp.status_code == 403 and "admin" in resp.json()["message"]
    assert api.store.incidents.get(inc_id).state == "open"
    assert (await api.get("/api/v1/tokens", token="read")).status_code == 403
    assert (await api.get("/api/v1/incidents", token="read")).status_code == 200


async def test_revoked_token_stops_working_without_restart(api: Api) -> None:
    assert (await api.get("/api/v1/nodes")).status_code == 200
    created = await api.post("/api/v1/tokens", json={"role": "read", "note": "pager"})
    assert created.status_code == 201
    new = created.json()
    assert (await api.get("/api/v1/nodes", token=new["token"])).status_code == 200
    assert (await api.client.delete(f"/api/v1/tokens/{new['id']}", headers=api.auth(api.admin))).status_code == 200
    assert (await api.get("/api/v1/nodes", token=new["token"])).status_code == 401
    listed = (await api.get("/api/v1/tokens", token="admin")).json()
    assert all("token" not in t for t in listed) and any(t["revoked_ts"] for t in listed)


async def test_auth_can_be_disabled_for_the_demo(db_url: str, tmp_path: Path) -> None:
    app = create_app(settings_for(db_url, tmp_path, auth=False))
    async with running(app) as client:
        body, headers = encoded(make_batch("node-z", "1", [ib_sample(time.time())]))
        assert (await client.post("/api/v1/ingest", content=body, headers=headers)).status_code == 200
        assert [n["node"] for n in (await client.get("/api/v1/nodes")).json()] == ["node-z"]


# ---- queries --------------------------------------------------------------------------------------


async def test_nodes_show_health_and_404_names_the_node(api: Api) -> None:
    await api.ingest("node-a", "1", port_samples(time.time(), 1.0, 1.0))
    nodes = (await api.get("/api/v1/nodes")).json()
    assert [n["node"] for n in nodes] == ["node-a"]
    assert nodes[0]["healthy"] is True and nodes[0]["collectors"][0]["collector"] == "infiniband"
    assert nodes[0]["series"] == 6
    missing = await api.get("/api/v1/nodes/node-q")
    assert missing.status_code == 404 and "node-q" in missing.json()["message"]


async def test_ports_rank_the_hottest_first(api: Api) -> None:
    now = time.time()
    await api.ingest("node-a", "1", port_samples(now, tx=40e9, rx=1e9, wait=5e6))
    await api.ingest("node-b", "1", port_samples(now, tx=5e9, rx=2e9))
    ports = (await api.get("/api/v1/ports", sort="throughput", limit=1)).json()
    assert len(ports) == 1 and ports[0]["node"] == "node-a"
    assert ports[0]["utilization"] == pytest.approx(0.8) and ports[0]["state"] == "ACTIVE"
    assert ports[0]["errors_per_second"] == pytest.approx(0.5) and ports[0]["xmit_wait_per_second"] == 5e6
    assert [p["node"] for p in (await api.get("/api/v1/ports", sort="name")).json()] == ["node-a", "node-b"]
    assert (await api.get("/api/v1/ports", state="DOWN")).json() == []
    bad = await api.get("/api/v1/ports", sort="hottest")
    assert bad.status_code == 422 and "sort" in bad.json()["message"]


async def test_series_accept_relative_and_rfc3339_times_and_buckets(api: Api) -> None:
    now = time.time()
    for i in range(6):
        await api.ingest("node-a", f"b{i}", [ib_sample(now - 600 + i * 10, value=1000.0 * i, rate=float(i))])
    rows = (await api.get("/api/v1/series", node="node-a", counter="port_xmit_data", since="-15m")).json()
    assert len(rows) == 1 and [p["rate"] for p in rows[0]["points"]] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 575))
    later = (await api.get("/api/v1/series", node="node-a", since=start)).json()
    assert [p["rate"] for p in later[0]["points"]] == [3.0, 4.0, 5.0]
    bucketed = (await api.get("/api/v1/series", node="node-a", since="-1h", step="1h")).json()
    assert sum(len(s["points"]) for s in bucketed) <= 2 and bucketed[0]["step_seconds"] == 3600
    bad = await api.get("/api/v1/series", since="yesterday")
    assert bad.status_code == 422 and "since" in bad.json()["message"] and "-15m" in bad.json()["message"]


def incident(
    key: str,
    state: IncidentState = IncidentState.OPEN,
    ts: float | None = None,
    timeline: Sequence[tuple[float, str]] = (),
) -> Incident:
    from fabricd.model import Candidate, Evidence

    now = ts or time.time()
    return Incident(
        key=key,
        kind=IncidentKind.CONGESTION,
        severity=Severity.WARNING,
        state=state,
        element="leaf-01~spine-02",
        summary="xmit wait on leaf-01 uplink",
        started_ts=now - 30,
        updated_ts=now,
        resolved_ts=now if state is IncidentState.RESOLVED else None,
        candidates=[Candidate("leaf-01~spine-02", 0.9, 0.7), Candidate("leaf-01", 0.4, 0.3)],
        affected=["node-a"],
        evidence=[Evidence("xmit_wait_ratio", "node-a", "mlx5_0", "1", 0.4, 0.1, now - 10)],
        timeline=list(timeline),
    )


async def test_incident_lifecycle_through_the_api(api: Api) -> None:
    inc_id, transition = api.store.incidents.upsert(incident("c1", timeline=[(1.0, "xmit wait rose")]))
    assert transition == "opened"
    listed = (await api.get("/api/v1/incidents", state="open")).json()
    assert [i["id"] for i in listed] == [inc_id]
    detail = (await api.get(f"/api/v1/incidents/{inc_id}")).json()
    assert detail["candidates"][0] == {"element": "leaf-01~spine-02", "score": 0.9, "weight": 0.7}
    assert detail["evidence"][0]["signal"] == "xmit_wait_ratio"
    acked = await api.post(f"/api/v1/incidents/{inc_id}/ack", json={"note": "looking", "by": "alice"})
    assert acked.status_code == 200 and acked.json()["state"] == "acked" and acked.json()["acked_by"] == "alice"
    # The engine keeps updating the incident: the engineer's ack survives.
    api.store.incidents.upsert(incident("c1"))
    assert (await api.get(f"/api/v1/incidents/{inc_id}")).json()["state"] == "acked"
    resolved = await api.post(f"/api/v1/incidents/{inc_id}/resolve")
    assert resolved.json()["state"] == "resolved" and resolved.json()["resolved_by"].startswith("token:")
    timeline = [e["what"] for e in resolved.json()["timeline"]]
    assert "xmit wait rose" in timeline and "acknowledged: looking" in timeline
    conflict = await api.post(f"/api/v1/incidents/{inc_id}/ack")
    assert conflict.status_code == 409 and "resolved" in conflict.json()["message"]
    assert (await api.get("/api/v1/incidents", state="open")).json() == []
    missing = await api.get("/api/v1/incidents/999999")
    assert missing.status_code == 404 and "999999" in missing.json()["message"]
    assert (await api.get("/api/v1/incidents", state="bogus")).status_code == 422


async def test_open_incidents_are_exported_by_kind_and_severity(api: Api) -> None:
    api.store.incidents.upsert(incident("c1"))
    api.store.incidents.upsert(incident("c2"))
    text = (await api.client.get("/metrics")).text
    assert 'fabricd_incidents_open{kind="congestion",severity="warning"} 2.0' in text
    assert 'fabricd_incidents_open{kind="pfc_storm",severity="critical"} 0.0' in text


async def test_pingmesh_matrix_and_nccl_runs(api: Api) -> None:
    from fabricd.model import Reading

    now = time.time()

    def probe(peer: str, name: str, value: float, kind: Kind, rate: float | None, unit: str) -> Sample:
        return Sample(
            now, Reading("pingmesh", peer, "", name.removesuffix("_seconds"), value, unit, kind, (), name), rate
        )

    mesh = [
        probe("node-b", "rtt_p50_seconds", 5e-6, Kind.GAUGE, None, "seconds"),
        probe("node-b", "rtt_p99_seconds", 9e-6, Kind.GAUGE, None, "seconds"),
        probe("node-b", "probes_sent", 100.0, Kind.COUNTER, 10.0, "probes"),
        probe("node-b", "probes_lost", 1.0, Kind.COUNTER, 1.0, "probes"),
    ]
    labels = (("placement", "in_place"), ("size", "1048576"))
    nccl = [
        Sample(
            now - 60,
            Reading(
                "nccl",
                "all_reduce",
                "",
                "busbw",
                40e9,
                "bytes_per_second",
                Kind.GAUGE,
                labels,
                "busbw_bytes_per_second",
            ),
        ),
        Sample(
            now - 60, Reading("nccl", "all_reduce", "", "time", 1e-3, "seconds", Kind.GAUGE, labels, "time_seconds")
        ),
    ]
    assert (await api.ingest("node-a", "1", mesh + nccl)).status_code == 200
    pairs = (await api.get("/api/v1/pingmesh", since="-5m")).json()
    assert pairs == [
        {
            "src": "node-a",
            "dst": "node-b",
            "p50_seconds": 5e-6,
            "p99_seconds": 9e-6,
            "loss_ratio": 0.1,
            "ts": pytest.approx(now),
        }
    ]
    runs = (await api.get("/api/v1/nccl", op="all_reduce", since="-1h")).json()
    assert len(runs) == 1 and runs[0]["values"] == {"busbw_bytes_per_second": 40e9, "time_seconds": 1e-3}
    assert runs[0]["labels"]["size"] == "1048576"
    assert (await api.get("/api/v1/nccl", op="alltoall")).json() == []


async def test_topology_status_and_probes(api: Api) -> None:
    assert (await api.get("/api/v1/topology")).status_code == 404
    topo = fat_tree(4, 1, 2, 2, "roce")
    route = [
        "node-001",
        "node-003",
        "node-001/mlx5_0",
        "node-003/mlx5_0",
        "node-001/mlx5_0~leaf-01",
        "leaf-01~spine-02",
        "leaf-02~spine-02",
        "node-003/mlx5_0~leaf-02",
    ]
    reply = [
        "node-003",
        "node-001",
        "node-003/mlx5_0~leaf-02",
        "leaf-02~spine-01",
        "leaf-01~spine-01",
        "node-001/mlx5_0~leaf-01",
    ]
    doc = to_doc(topo, {("node-001", "node-003"): route}, {("node-001", "node-003"): reply})
    put = await api.client.put("/api/v1/topology", json=doc, headers=api.auth(api.read))
    assert put.status_code == 403
    put = await api.client.put("/api/v1/topology", json=doc, headers=api.auth(api.admin))
    assert put.status_code == 200 and put.json()["links"] == doc["links"]
    got = (await api.get("/api/v1/topology")).json()
    uploaded = [{**r, "source": "upload", "traced_ts": None, "version": None} for r in doc["routes"]]
    assert uploaded[0]["reply"] == reply  # where the replies go, kept as uploaded
    assert got["elements"] == doc["elements"] and got["routes"] == uploaded
    # A topology the detectors could not use is refused at upload, naming what is wrong.
    bad_link = {**doc, "links": [*doc["links"], {"a": "node-009/mlx5_0", "b": "leaf-01"}]}
    put = await api.client.put("/api/v1/topology", json=bad_link, headers=api.auth(api.admin))
    assert put.status_code == 422 and put.json()["message"] == (
        "topology: links[8] (node-009/mlx5_0~leaf-01): unknown end node-009/mlx5_0 (declare it in elements)"
    )
    bad_route = {**doc, "routes": [{"src": "node-001", "dst": "node-003", "elements": ["leaf-01~spine-09"]}]}
    put = await api.client.put("/api/v1/topology", json=bad_route, headers=api.auth(api.admin))
    assert (
        put.status_code == 422
        and "routes[0] (node-001 -> node-003): unknown element(s) leaf-01~spine-09" in put.json()["message"]
    )
    bad_reply = {**doc, "routes": [{**doc["routes"][0], "reply": ["leaf-02~spine-07"]}]}
    put = await api.client.put("/api/v1/topology", json=bad_reply, headers=api.auth(api.admin))
    assert (
        put.status_code == 422
        and "routes[0] (node-001 -> node-003): unknown element(s) leaf-02~spine-07" in put.json()["message"]
    )
    assert (await api.get("/api/v1/topology")).json()["routes"] == uploaded  # the last good one stays
    await api.ingest("node-a", "1", [ib_sample(time.time())])
    api.store.incidents.upsert(incident("c1"))
    status = (await api.get("/api/v1/status")).json()
    assert status["nodes"] == 1 and status["incidents_open"] == 1 and status["schema_revision"]
    assert status["detection_backlog_points"] is None  # this app runs no detector
    assert status["latest_unflushed_series"] >= 0
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    assert (await api.client.get("/readyz")).json()["status"] == "ready"
    assert (await api.client.get("/no/such/thing")).json()["error"] == "not_found"


async def test_status_counts_stale_and_unhealthy_nodes_as_their_records_say(api: Api) -> None:
    """Counted in the database (``Inventory.node_states``), not from a record per node: a node is
    stale when its last batch is older than ``node_stale_seconds``, unhealthy when stale or when a
    collector's last run failed; the counts agree with the nodes' own records."""
    now = time.time()
    stale_at = now - api.svc.settings.node_stale_seconds - 60

    def stored(node: str, at: float, ok: bool) -> None:
        batch = make_batch(node, "1", [ib_sample(at)], ts=at)
        health = [
            CollectorHealth("infiniband", True, 0.004, at, "", 1),
            CollectorHealth("ethtool", ok, 0.01, at, "" if ok else "EPERM", 0),
        ]
        api.store.writer.ingest(replace(batch, health=health), at, 10)

    stored("fresh-ok", now, True)
    stored("fresh-failing", now, False)
    stored("stale-ok", stale_at, True)
    stored("stale-failing", stale_at, False)
    status = (await api.get("/api/v1/status")).json()
    assert (status["nodes"], status["nodes_stale"], status["nodes_unhealthy"]) == (4, 2, 3)
    records = {n["node"]: (n["stale"], n["healthy"]) for n in (await api.get("/api/v1/nodes")).json()}
    assert records == {
        "fresh-ok": (False, True),
        "fresh-failing": (False, False),
        "stale-ok": (True, False),
        "stale-failing": (True, False),
    }


async def test_latest_values_are_written_every_interval_and_at_shutdown(db_url: str, tmp_path: Path) -> None:
    """In memory for /metrics and /ports; written to the table by the flush loop, and by a
    clean shutdown, so a restarted service starts from them."""
    app = create_app(settings_for(db_url, tmp_path, latest_flush_seconds=0.2))
    now = time.time()
    async with running(app) as client:
        api = Api(client, app)
        assert (await api.ingest("node-a", "b1", port_samples(now, 2e9, 1e9))).status_code == 200
        flushed = "\nfabricd_store_latest_flushed_series_total 6.0\n"
        for _ in range(400):  # 20 s: the flush loop runs every 0.2 s, even on a loaded CI machine
            # The counter moves on the event loop once the flush's thread has returned; the
            # gauge reads 0 only after every taken series is written (not when they are taken).
            if flushed in (await client.get("/metrics")).text:
                break
            await asyncio.sleep(0.05)
        assert flushed in (await client.get("/metrics")).text
        assert api.store.latest.unflushed() == 0
    app = create_app(settings_for(db_url, tmp_path, latest_flush_seconds=3600))  # only the shutdown writes
    async with running(app) as client:
        api = Api(client, app)
        assert (await api.ingest("node-a", "b2", port_samples(now + 10, 3e9, 1e9))).status_code == 200
        assert api.store.latest.unflushed() == 6
        assert "fabricd_store_latest_unflushed_series 6.0" in (await client.get("/metrics")).text
    try:
        with api.store.engine.connect() as conn:
            names = dict(conn.execute(text("SELECT id, name FROM series")).all())
            written = {names[sid]: row[3] for sid, row in written_latest(conn).items() if row[1] == now + 10}
    finally:
        api.store.engine.dispose()
    assert written["port_transmit_data"] == 3e9 and len(written) == 6
