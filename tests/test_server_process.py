"""The real service process: restart durability, bootstrap token, token CLI, refusing a newer schema."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from fabricd.server import db
from tests.helpers import skip_or_fail
from tests.support.points import written_latest
from tests.support.server import ServerProcess, backend_url, encoded, ib_sample, make_batch, pg_reachable


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres" and not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    with backend_url(request.param, tmp_path) as url:
        yield url


def fabricd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabricd", *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.slow
def test_nothing_acknowledged_is_missing_after_a_restart(db_url: str, tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", db_url, auth=False).start()
    acked: list[str] = []
    try:
        for i in range(20):
            batch = make_batch(f"node-{i % 3}", f"b{i}", [ib_sample(time.time() - 100 + i, device=f"mlx5_{i % 4}")])
            body, headers = encoded(batch)
            resp = httpx.post(f"{server.url}/api/v1/ingest", content=body, headers=headers, timeout=10)
            if resp.status_code == 200:
                acked.append(batch.batch_id)
    finally:
        code = server.stop()
    assert "Application shutdown complete" in server.log.read_text()  # SIGTERM: a graceful stop
    assert code == 0  # ... and a successful exit (not 143) for systemd and supervisors
    assert len(acked) == 20
    server = ServerProcess(tmp_path / "data", db_url, auth=False).start()
    try:
        nodes = httpx.get(f"{server.url}/api/v1/nodes", timeout=10).json()
        assert sum(n["batches"] for n in nodes) == 20
        series = httpx.get(f"{server.url}/api/v1/series", params={"since": "0", "limit": 1000}, timeout=10).json()
        assert sum(len(s["points"]) for s in series) == 20
        # Retries of acknowledged batches after the restart are still recognized.
        body, headers = encoded(make_batch("node-0", "b0", [ib_sample(1_800_000_000.0)]))
        resp = httpx.post(f"{server.url}/api/v1/ingest", content=body, headers=headers, timeout=10)
        assert resp.json()["duplicate"] is True
    finally:
        server.stop()


@pytest.mark.slow
def test_bootstrap_token_and_token_cli_work_without_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    token_file = tmp_path / "secrets" / "admin.token"
    server = ServerProcess(
        data,
        extra=["--log-level", "warning"],
        env={"FABRICD_BOOTSTRAP_TOKEN_FILE": str(token_file), "FABRICD_TOKEN_CACHE_SECONDS": "0"},
    )
    server.start()
    try:
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        admin = token_file.read_text().strip()
        auth = {"Authorization": f"Bearer {admin}"}
        assert httpx.get(f"{server.url}/api/v1/tokens", headers=auth, timeout=10).status_code == 200
        created = fabricd("token", "create", "--role", "agent", "--node", "node-7", "--data-dir", str(data))
        assert created.returncode == 0, created.stderr
        agent = created.stdout.strip()
        assert agent.startswith("fabricd_") and "created" in created.stderr
        body, headers = encoded(make_batch("node-7", "1", [ib_sample(time.time())]))
        ok = httpx.post(
            f"{server.url}/api/v1/ingest",
            content=body,
            headers={**headers, "Authorization": f"Bearer {agent}"},
            timeout=10,
        )
        assert ok.status_code == 200
        listed = fabricd("token", "list", "--json", "--data-dir", str(data))
        assert '"node": "node-7"' in listed.stdout and agent not in listed.stdout
        assert fabricd("token", "revoke", agent, "--data-dir", str(data)).returncode == 0
        body, headers = encoded(make_batch("node-7", "2", [ib_sample(time.time())]))
        denied = httpx.post(
            f"{server.url}/api/v1/ingest",
            content=body,
            headers={**headers, "Authorization": f"Bearer {agent}"},
            timeout=10,
        )
        assert denied.status_code == 401
        missing = fabricd("token", "revoke", "4242", "--data-dir", str(data))
        assert missing.returncode == 1 and "no such token" in missing.stderr
    finally:
        server.stop()
    # The file is not overwritten on the next start: the admin token already exists.
    before = token_file.read_text()
    server.start()
    server.stop()
    assert token_file.read_text() == before


def test_server_refuses_a_newer_schema(db_url: str, tmp_path: Path) -> None:
    engine = db.make_engine(db_url)
    db.prepare(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffff'"))
    engine.dispose()
    result = fabricd("server", "--db", db_url, "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0")
    assert result.returncode == 1
    assert "newer than this fabricd knows" in result.stderr and "ffff" in result.stderr
    # ... and says how to proceed (docs/operations.md "Upgrades"), with no traceback.
    assert "run the fabricd release that wrote it, or, to roll back, restore the backup" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_latest_values_survive_a_kill_9_between_writes(db_url: str, tmp_path: Path) -> None:
    """Latest values are written every latest_flush_seconds; a crash before the write loses none:
    the restarted service replays the points stored since the last write."""
    slow_flush = {"FABRICD_LATEST_FLUSH_SECONDS": "3600"}
    server = ServerProcess(tmp_path / "data", db_url, auth=False, env=slow_flush).start()
    now = time.time()
    try:
        for i, rate in enumerate((1e9, 2e9)):
            body, headers = encoded(make_batch("node-0", f"b{i}", [ib_sample(now - 20 + 10 * i, rate=rate)]))
            assert (
                httpx.post(f"{server.url}/api/v1/ingest", content=body, headers=headers, timeout=10).status_code == 200
            )
        assert httpx.get(f"{server.url}/api/v1/status", timeout=10).json()["latest_unflushed_series"] == 1
    finally:
        assert server.proc is not None
        server.proc.kill()  # no shutdown: nothing written
        server.proc.wait(10)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            assert written_latest(conn) == {}
    finally:
        engine.dispose()
    fleet_view = {**slow_flush, "FABRICD_METRICS_FLEET_VIEW": "true"}  # the replayed value on /metrics too
    server = ServerProcess(tmp_path / "data", db_url, auth=False, env=fleet_view).start()
    try:
        ports = httpx.get(f"{server.url}/api/v1/ports", timeout=10).json()
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        assert server.stop() == 0
    assert (
        'fabricd_infiniband_port_transmit_data_bytes_per_second{device="mlx5_0",node="node-0",port="1"} 2e+09'
        in metrics
    )
    assert len(ports) == 1 and ports[0]["node"] == "node-0"
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:  # the clean stop wrote the replayed value
            assert [row[3] for row in written_latest(conn).values()] == [2e9]
    finally:
        engine.dispose()
