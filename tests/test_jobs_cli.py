"""``fabricd jobs``, ``fabricd jobs ID``, ``fabricd incidents --job`` and the incident page's affected jobs,
against a real central service process."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabricd.cli import main
from fabricd.model import AffectedJob, Incident, IncidentKind, IncidentState, Severity
from fabricd.server import db
from fabricd.server.jobreports import JobReport, JobSeen
from fabricd.server.store.storage import Storage
from fabricd.topology import fat_tree, to_doc
from tests.support.server import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def central(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    data: Path = tmp_path_factory.mktemp("jobs-cli") / "data"
    engine = db.make_engine(f"sqlite:///{data / 'fabricd.db'}")
    db.prepare(engine)
    store = Storage.open(engine)
    now = time.time()
    store.topology.put(to_doc(fat_tree(8, 1, 4, 2)), now)
    seen = JobSeen("8", "slurm", "bob", "train-8", "0", "mlx5_0")
    store.jobs.record([JobReport(n, now - 60, (seen,), True) for n in ("node-004", "node-005")])
    iid, _ = store.incidents.upsert(
        Incident(
            key="congestion:leaf-02~spine-01",
            kind=IncidentKind.CONGESTION,
            severity=Severity.WARNING,
            state=IncidentState.OPEN,
            element="leaf-02~spine-01",
            summary="xmit wait on leaf-02 uplink",
            started_ts=now - 30,
            updated_ts=now,
            affected_jobs=[AffectedJob("8", "bob", "train-8", ("node-004", "node-005"))],
        )
    )
    engine.dispose()
    server = ServerProcess(data, auth=False, extra=["--log-level", "warning"]).start()
    yield server, iid
    server.stop()


def _run(capsys: pytest.CaptureFixture[str], server: ServerProcess, *args: str) -> tuple[int, str]:
    code = main([*args, "--server", server.url])
    out, _ = capsys.readouterr()
    return code, out


def _rows(out: str, title: str) -> list[list[str]]:
    """The body rows of the rich table titled ``title`` (cells stripped)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    rows = []
    for line in lines[start + 4 :]:  # title, top rule, header, header rule
        if not line.startswith("│"):
            break
        rows.append([cell.strip() for cell in line.strip("│").split("│")])
    return rows


def test_jobs_table_and_one_job(central: tuple[ServerProcess, int], capsys: pytest.CaptureFixture[str]) -> None:
    server, iid = central
    code, out = _run(capsys, server, "jobs")
    assert code == 0
    assert [[r[0], r[1], r[2], r[3], r[5]] for r in _rows(out, "Jobs (1)")] == [
        ["8", "bob", "train-8", "slurm", "node-004 node-005"]
    ]
    code, out = _run(capsys, server, "jobs", "8")
    assert code == 0 and out.splitlines()[0] == "job 8 (slurm) train-8 by bob: 2 nodes"
    assert _rows(out, "Nodes and HCAs") == [["node-004", "mlx5_0"], ["node-005", "mlx5_0"]]
    assert [r[0] for r in _rows(out, "Open incidents")] == [str(iid)]
    code, _ = _run(capsys, server, "jobs", "999")
    assert code == 1


def test_incidents_by_job_and_the_incident_page(
    central: tuple[ServerProcess, int], capsys: pytest.CaptureFixture[str]
) -> None:
    server, iid = central
    code, out = _run(capsys, server, "incidents", "--job", "8", "--json")
    assert code == 0 and [i["id"] for i in json.loads(out)] == [iid]
    code, out = _run(capsys, server, "incidents", "--job", "7", "--json")
    assert code == 0 and json.loads(out) == []
    code, out = _run(capsys, server, "incident", str(iid))
    assert code == 0
    # the incident page (plain text, fabricd/cli/incident_page.py): one line per job hit
    affected = [line.split(None, 1) for line in out.splitlines() if line.strip().startswith("job ")]
    assert affected == [["job", "8 (bob, train-8): node-004, node-005"]]
    # no affected nodes or pairs stored for this incident, one job joined by the central
    assert [line for line in out.splitlines() if line.startswith("Affected: ")] == [
        "Affected: 0 nodes, 0 node pairs, 1 job"
    ]
