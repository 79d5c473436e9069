"""On-call CLI against a real central service: tables, --json, exit codes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fabricd.cli import main
from fabricd.model import Incident, IncidentKind, IncidentState, Kind, Severity
from fabricd.server import db
from fabricd.server.store.storage import Storage
from tests.support.server import ServerProcess, encoded, free_port, ib_sample, make_batch

pytestmark = pytest.mark.slow


class Fleet:
    def __init__(self, server: ServerProcess, admin: str, read: str, incident_id: int) -> None:
        self.server, self.admin, self.read, self.incident_id = server, admin, read, incident_id

    def run(self, capsys: pytest.CaptureFixture[str], *args: str, token: str | None = None) -> tuple[int, str, str]:
        code = main([*args, "--server", self.server.url, "--token", token or self.read])
        out, err = capsys.readouterr()
        return code, out, err


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    data: Path = tmp_path_factory.mktemp("oncall") / "data"
    engine = db.make_engine(f"sqlite:///{data / 'fabricd.db'}")
    db.prepare(engine)
    store = Storage.open(engine)
    now = time.time()
    admin = store.tokens.create("admin", now, note="oncall")[1]
    read = store.tokens.create("read", now)[1]
    iid, _ = store.incidents.upsert(
        Incident(
            key="congestion:leaf-01",
            kind=IncidentKind.CONGESTION,
            severity=Severity.CRITICAL,
            state=IncidentState.OPEN,
            element="leaf-01~spine-[02]",
            summary="xmit wait 40% on leaf-01 uplink",
            started_ts=now - 60,
            updated_ts=now,
        )
    )
    engine.dispose()
    server = ServerProcess(data, extra=["--log-level", "warning"]).start()
    samples = [
        ib_sample(now, rate=30e9),
        ib_sample(now, device="mlx5_1", rate=1e6),
        ib_sample(
            now, counter="rate", name="link_rate", unit="bytes_per_second", value=50e9, kind=Kind.GAUGE, rate=None
        ),
    ]
    body, headers = encoded(make_batch("node-a", "1", samples))
    httpx.post(
        f"{server.url}/api/v1/ingest", content=body, headers={**headers, "Authorization": f"Bearer {admin}"}, timeout=10
    ).raise_for_status()
    try:
        yield Fleet(server, admin, read, iid)
    finally:
        server.stop()


def test_status_summarizes_the_fleet(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = fleet.run(capsys, "status")
    assert code == 0 and "nodes 1" in out and "node-a" in out and "infiniband:ok" in out
    code, out, _ = fleet.run(capsys, "status", "--json")
    assert json.loads(out)["status"]["incidents_open"] == 1


def test_incidents_and_incident_detail(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = fleet.run(capsys, "incidents", "--open")
    assert code == 0 and "leaf-01~spine-[02]" in out and "critical" in out
    code, out, _ = fleet.run(capsys, "incident", str(fleet.incident_id))
    assert code == 0 and "xmit wait 40% on leaf-01 uplink" in out and "Timeline" in out
    code, out, err = fleet.run(capsys, "incident", "4242")
    assert code == 1 and "404" in err and "4242" in err


def test_ports_top_shows_the_hottest_port_first(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = fleet.run(capsys, "ports", "--top", "1", "--json")
    rows = json.loads(out)
    assert code == 0 and [(r["device"], r["utilization"]) for r in rows] == [("mlx5_0", 0.6)]
    code, out, _ = fleet.run(capsys, "ports", "--top", "20")
    assert code == 0 and out.index("mlx5_0") < out.index("mlx5_1") and "240 Gb/s" in out


def test_ack_needs_admin_then_resolve(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    iid = str(fleet.incident_id)
    code, _, err = fleet.run(capsys, "ack", iid)
    assert code == 1 and "403" in err and "admin" in err
    code, out, _ = fleet.run(capsys, "ack", iid, "--note", "paging network team", token=fleet.admin)
    assert code == 0 and "is acked" in out
    code, out, _ = fleet.run(capsys, "incidents", "--state", "acked", "--json")
    assert [i["id"] for i in json.loads(out)] == [fleet.incident_id]
    code, out, _ = fleet.run(capsys, "resolve", iid, "--by", "bob", token=fleet.admin)
    assert code == 0 and "resolved (by bob)" in out


def test_exit_codes_for_scripts(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["status", "--server", f"http://127.0.0.1:{free_port()}", "--timeout", "2"])
    assert code == 3 and "cannot reach" in capsys.readouterr().err
    assert fleet.run(capsys, "status", token="fabricd_wrong")[0] == 1
    with pytest.raises(SystemExit) as usage:
        main(["ports", "--top", "many"])
    assert usage.value.code == 2
