"""A stop held up past its deadline ends the service with the stacks, and loses nothing
(``fabricd/server/shutdown.py``): a real ``fabricd server`` on PostgreSQL, whose shutdown write of
the latest values waits on a lock another session holds."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy

from fabricd.server.shutdown import EXIT_CODE, Deadline
from tests.helpers import skip_or_fail
from tests.support.points import written_latest
from tests.support.server import ServerProcess, encoded, ib_sample, make_batch, pg_reachable, pg_schema

DEADLINE_SECONDS = 3.0


def _post(server: ServerProcess, batch_id: str, ts: float, value: float) -> None:
    body, headers = encoded(make_batch("node-0", batch_id, [ib_sample(ts, value=value)]))
    resp = httpx.post(f"{server.url}/api/v1/ingest", content=body, headers=headers, timeout=10)
    assert resp.status_code == 200, resp.text


@pytest.mark.slow
@pytest.mark.postgres
def test_a_stop_held_by_a_database_lock_ends_at_its_deadline_with_the_stacks_and_loses_nothing(
    tmp_path: Path,
) -> None:
    if not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    now = time.time()
    env = {"FABRICD_SHUTDOWN_TIMEOUT_SECONDS": str(DEADLINE_SECONDS)}
    with pg_schema() as url:
        engine = sqlalchemy.create_engine(url)
        server = ServerProcess(tmp_path / "data", url, auth=False, env=env).start()
        try:
            _post(server, "b0", now - 20, 1000.0)
            with engine.connect() as locker:
                locker.execute(sqlalchemy.text("LOCK TABLE latest_chunks IN ACCESS EXCLUSIVE MODE"))
                _post(server, "b1", now - 10, 2000.0)  # stored: ingest does not write latest_chunks
                assert server.proc is not None
                server.proc.terminate()
                try:
                    code = server.proc.wait(60)  # the lock is still held: only the deadline ends it
                except subprocess.TimeoutExpired:
                    pytest.fail("the service still waits on the lock 60 s after SIGTERM")
                locker.rollback()
            server.proc = None
            log = server.log.read_text()
            assert code == EXIT_CODE
            assert 'msg="shutdown did not finish in time' in log
            # faulthandler's dump names the hung thread's frames: the shutdown's latest-values write.
            assert "fabricd/server/store/latest.py" in log.split("shutdown did not finish", 1)[1]
            assert "Application shutdown complete" not in log

            with engine.connect() as conn:
                assert written_latest(conn) == {}  # the shutdown's write never happened ...
            server = ServerProcess(tmp_path / "data", url, auth=False, env=env).start()
            # ... and the restart rebuilds the latest value from the points stored since: b1's
            series = httpx.get(f"{server.url}/api/v1/series", params={"since": "0"}, timeout=10).json()
            assert [(p["ts"], p["value"]) for s in series for p in s["points"]] == [
                (now - 20, 1000.0),
                (now - 10, 2000.0),
            ]
            server.stop()  # a stop with nothing in its way: clean, and it writes the latest value
            assert server.log.read_text().count("Application shutdown complete") == 1
            with engine.connect() as conn:
                assert [(row[1], row[2]) for row in written_latest(conn).values()] == [(now - 10, 2000.0)]
        finally:
            server.stop()
            engine.dispose()


def test_the_deadline_dumps_every_threads_stack_then_exits_with_its_code(tmp_path: Path) -> None:
    """In process, with the exit recorded instead of taken: the stacks name the threads at work (a
    thread stuck in ``hung`` here), and the exit comes after them."""
    exits: list[int] = []
    release = threading.Event()

    def hung() -> None:
        release.wait(30)

    worker = threading.Thread(target=hung, daemon=True)
    worker.start()
    with open(tmp_path / "stderr", "w") as stream:
        Deadline(0.05, stream=stream, exit=exits.append).start()
        for _ in range(100):
            if exits:
                break
            time.sleep(0.05)
    release.set()
    dump = (tmp_path / "stderr").read_text()
    assert exits == [EXIT_CODE]
    assert "in hung" in dump and "in expire" in dump  # the stuck thread's frame, and the deadline's own
