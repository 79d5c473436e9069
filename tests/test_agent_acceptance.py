"""Acceptance: a real ``fabricd server`` and real ``fabricd agent`` processes, killed and restarted.

Each test copies the procfs sysfs tree (tests/cases/infiniband/procfs, see its ORIGIN.md) into
tmp_path, scrapes it every second, and at the end counts what the central stored, straight from
its SQLite file: per series, every scrape timestamp exactly once (no duplicate) and no missing
scrape (no gap: consecutive timestamps less than two intervals apart).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import sqlite3
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fabricd.transport.spool import CorruptSpoolFile, unpack
from fabricd.wire import decode
from tests.helpers import CASES, REPO
from tests.support.points import raw_points_by_series
from tests.test_transport_central_double import Tls, free_port, make_tls

pytestmark = pytest.mark.slow

SYSFS = CASES / "infiniband" / "procfs" / "sys"
INTERVAL = 1.0
OUTAGE_SECONDS = 20.0  # the outage length
# A missing scrape shows as two intervals between neighbours; a late one (loaded CI) as less.
GAP = 1.9 * INTERVAL


def wait_for(what: str, predicate: Callable[[], bool], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {seconds:g}s waiting for: {what}")


class Proc:
    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.args, self.log, self.env = args, log, env
        self.p: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.p = subprocess.Popen(
                [sys.executable, "-m", "fabricd", *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env=dict(os.environ, **(self.env or {})),
            )

    def alive(self) -> bool:
        return self.p is not None and self.p.poll() is None

    def signal(self, sig: int) -> None:
        assert self.p is not None
        self.p.send_signal(sig)

    def kill9(self) -> None:
        assert self.p is not None
        self.p.kill()
        self.p.wait(10)

    def term(self) -> int:
        assert self.p is not None
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        return self.p.wait(30)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


class Central(Proc):
    def __init__(self, root: Path, tls: Tls | None = None) -> None:
        self.port, self.tls, self.db = free_port(), tls, root / "central.sqlite"
        args = [
            "server",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--db",
            f"sqlite:///{self.db}",
            "--data-dir",
            str(root / "central"),
            "--no-auth",
        ]
        if tls:
            args += ["--tls-certfile", str(tls.cert), "--tls-keyfile", str(tls.key)]
        super().__init__(args, root / "central.log")

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> None:
        super().start()
        verify = ssl.create_default_context(cafile=str(self.tls.ca)) if self.tls else True
        wait_for(f"central on {self.url}\n{self.text()[-2000:]}", lambda: self._healthy(verify))

    def _healthy(self, verify: ssl.SSLContext | bool) -> bool:
        assert self.alive(), self.text()[-2000:]
        try:
            return httpx.get(f"{self.url}/healthz", verify=verify, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stored(self, node: str) -> dict[tuple[str, str], list[float]]:
        """Every stored port_xmit_data timestamp per (device, port), duplicates kept, sorted."""
        if not self.db.exists():
            return {}
        con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)
        try:
            rows = sorted(
                (
                    (dev, port, ts)
                    for n, src, dev, port, ctr, ts in raw_points_by_series(con)
                    if (n, src, ctr) == (node, "infiniband", "port_xmit_data")
                ),
                key=lambda r: r[2],
            )
        except sqlite3.OperationalError:  # schema not created yet
            return {}
        finally:
            con.close()
        out: dict[tuple[str, str], list[float]] = {}
        for device, port, ts in rows:
            out.setdefault((device, port), []).append(ts)
        return out

    def scrapes(self, node: str) -> list[float]:
        return next(iter(self.stored(node).values()), [])


class Agent(Proc):
    def __init__(self, root: Path, central: Central, node: str = "node-1", **env: str) -> None:
        sysfs = root / "sys"
        if not sysfs.exists():
            shutil.copytree(SYSFS, sysfs)
        self.metrics_port, self.data = free_port(), root / f"agent-{node}"
        settings = {
            "FABRICD_TRANSPORT__BATCH_MAX_SECONDS": "1",
            "FABRICD_TRANSPORT__TIMEOUT_SECONDS": "2",
            "FABRICD_TRANSPORT__BACKOFF_INITIAL_SECONDS": "0.2",
            "FABRICD_TRANSPORT__BACKOFF_MAX_SECONDS": "1",
            "FABRICD_SPOOL__DRAIN_BATCHES_PER_SECOND": "20",
            **env,
        }
        args = [
            "agent",
            "--central",
            central.url,
            "--node",
            node,
            "--sysfs-root",
            str(sysfs),
            "--interval",
            str(INTERVAL),
            "--data-dir",
            str(self.data),
            "--metrics-listen",
            f"127.0.0.1:{self.metrics_port}",
        ]
        super().__init__(args, root / f"agent-{node}.log", settings)

    @property
    def spool(self) -> Path:
        return self.data / "spool"

    def metric(self, name: str, **labels: str) -> float:
        try:
            text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return float("nan")
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
        return float("nan")

    def spooled_timestamps(self) -> dict[str, set[float]]:
        """What the spool holds, per file (read-only: the agent may be dead or running)."""
        out = {}
        for path in sorted(self.spool.glob("*.batch")):
            try:
                sb = unpack(path.read_bytes())
            except (CorruptSpoolFile, FileNotFoundError):
                continue
            batch = decode(sb.body, "application/json" if sb.json else "application/msgpack", sb.gzip)
            out[path.name] = {s.ts for s in batch.samples}
        return out


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Every process a test starts is registered here and killed at teardown, whatever happened."""
    started: list[Proc] = []
    yield started
    for proc in started:
        if proc.alive():
            proc.kill9()


def gaps(ts: list[float]) -> list[tuple[float, float]]:
    return [(a, b) for a, b in itertools.pairwise(ts) if b - a >= GAP]


def assert_each_scrape_once(central: Central, node: str) -> list[float]:
    """No duplicate in any series, and every series holds the same scrapes; returns them."""
    stored = central.stored(node)
    assert len(stored) == 4, f"expected the fixture's 4 ports, got {sorted(stored)}"
    for key, ts in stored.items():
        assert len(ts) == len(set(ts)), f"duplicate samples in {key}"
    first = next(iter(stored.values()))
    assert all(ts == first for ts in stored.values()), "series disagree on which scrapes they hold"
    return first


def drained(agent: Agent) -> Callable[[], bool]:
    return lambda: agent.metric("fabricd_agent_spool_batches") == 0


def test_central_killed_for_20s_loses_nothing_and_duplicates_nothing(tmp_path: Path, procs: list[Proc]) -> None:
    central = Central(tmp_path)
    agent = Agent(tmp_path, central)
    procs += [central, agent]
    central.start()
    agent.start()
    wait_for("3 scrapes stored", lambda: len(central.scrapes("node-1")) >= 3)
    central.kill9()
    time.sleep(OUTAGE_SECONDS)
    assert agent.metric("fabricd_agent_spool_batches") >= OUTAGE_SECONDS / 2  # ~1 batch/s went to disk
    assert agent.metric("fabricd_agent_central_up") == 0
    central.start()
    wait_for("the spool to drain", drained(agent))
    wait_for("a live batch after the drain", lambda: agent.metric("fabricd_agent_batches_sent_total") > 0)
    assert agent.term() == 0
    scrapes = assert_each_scrape_once(central, "node-1")
    assert gaps(scrapes) == []
    assert scrapes[-1] - scrapes[0] >= OUTAGE_SECONDS


def test_agent_killed_with_a_spool_sends_it_after_restart(tmp_path: Path, procs: list[Proc]) -> None:
    central = Central(tmp_path)
    agent = Agent(tmp_path, central)
    procs += [central, agent]
    central.start()
    agent.start()
    wait_for("3 scrapes stored", lambda: len(central.scrapes("node-1")) >= 3)
    central.kill9()
    wait_for("4 batches spooled", lambda: agent.metric("fabricd_agent_spool_batches") >= 4)
    agent.kill9()
    spooled = set().union(*agent.spooled_timestamps().values())
    agent.start()  # the central is still down: the old spool and new batches wait together
    wait_for("the restarted agent to spool", lambda: len(agent.spooled_timestamps()) > len(spooled) // 4 + 1)
    central.start()
    wait_for("the spool to drain", drained(agent))
    assert agent.term() == 0
    scrapes = assert_each_scrape_once(central, "node-1")
    assert spooled <= set(scrapes), "a batch the spool had acknowledged was lost"
    # At most one hole: the seconds the agent was dead (plus its open, unspooled batch), after
    # everything the spool held. A quick restart may leave none.
    holes = gaps(scrapes)
    assert len(holes) <= 1 and all(start >= max(spooled) for start, _ in holes)


def test_central_restarted_with_a_batch_in_flight_loses_and_duplicates_nothing(
    tmp_path: Path, procs: list[Proc]
) -> None:
    central = Central(tmp_path)
    agent = Agent(tmp_path, central)
    procs += [central, agent]
    central.start()
    agent.start()
    wait_for("3 scrapes stored", lambda: len(central.scrapes("node-1")) >= 3)
    # Frozen central: the agent's request is accepted by the kernel and never answered (in flight,
    # unacknowledged), then the process dies under it.
    central.signal(signal.SIGSTOP)
    time.sleep(2.5)
    central.kill9()
    central.start()
    # Killed at moments spread over the one-second batch cycle: some land mid-ingest, where the
    # central may have stored a batch whose acknowledgement never reaches the agent.
    for offset in (0.25, 0.75):
        time.sleep(1.0 + offset)
        central.kill9()
        central.start()
    # A graceful restart: uvicorn finishes the request in flight, then exits (uvicorn re-raises
    # SIGTERM after its shutdown, so the exit status is the signal's).
    time.sleep(1.0)
    central.term()
    central.start()
    wait_for("the spool to drain", drained(agent))
    wait_for("a live batch after the drain", lambda: agent.metric("fabricd_agent_batches_sent_total") > 0)
    assert agent.term() == 0
    scrapes = assert_each_scrape_once(central, "node-1")
    assert gaps(scrapes) == []


def test_a_full_spool_drops_the_oldest_keeps_running_and_recovers(tmp_path: Path, procs: list[Proc]) -> None:
    central = Central(tmp_path)  # not started yet: the agent begins in an outage
    agent = Agent(tmp_path, central, FABRICD_SPOOL__MAX_BYTES="6000")
    procs += [central, agent]
    agent.start()
    wait_for("a first batch spooled", lambda: len(agent.spooled_timestamps()) >= 1)
    spooled = agent.spooled_timestamps()  # names sort in spooling order; 6000 bytes hold several
    first = spooled[min(spooled)]
    wait_for(
        "batches dropped for a full spool",
        lambda: agent.metric("fabricd_agent_batches_dropped_total", reason="spool_full") >= 2,
    )
    assert agent.alive()
    assert agent.metric("fabricd_agent_spool_bytes") <= 6000
    early = min(set().union(*agent.spooled_timestamps().values()))
    central.start()
    wait_for("the spool to drain", drained(agent))
    sent = agent.metric("fabricd_agent_batches_sent_total")
    wait_for("live data after recovery", lambda: agent.metric("fabricd_agent_batches_sent_total") >= sent + 2)
    assert agent.term() == 0
    scrapes = assert_each_scrape_once(central, "node-1")
    assert not first & set(scrapes)  # the oldest were dropped ...
    assert early <= scrapes[0]  # ... nothing spooled before what the full spool kept came back ...
    assert gaps(scrapes) == []  # ... and only they: the newest kept, then live data without a hole


def test_a_restarted_agents_first_metrics_count_the_spool_it_left(tmp_path: Path, procs: list[Proc]) -> None:
    """/metrics answers only once the spool is indexed: its first page after a restart already
    counts the batches the last run left (it said 0 while the spool was being opened, and a test
    waiting for "drained" went on before the drain had begun)."""
    central = Central(tmp_path)  # never started: the batches stay in the spool
    agent = Agent(tmp_path, central)
    procs += [central, agent]
    agent.start()
    wait_for("3 batches spooled", lambda: len(agent.spooled_timestamps()) >= 3)
    assert agent.term() == 0
    held = len(agent.spooled_timestamps())
    agent.start()
    first = float("nan")
    deadline = time.monotonic() + 60
    while first != first and time.monotonic() < deadline:  # NaN until /metrics answers
        first = agent.metric("fabricd_agent_spool_batches")
    assert first >= held
    assert agent.term() == 0


def test_a_truncated_spool_file_is_quarantined_and_the_rest_is_sent(tmp_path: Path, procs: list[Proc]) -> None:
    central = Central(tmp_path)
    agent = Agent(tmp_path, central)
    procs += [central, agent]
    agent.start()  # central down: everything goes to the spool
    wait_for("3 batches spooled", lambda: len(agent.spooled_timestamps()) >= 3)
    assert agent.term() == 0
    spooled = agent.spooled_timestamps()
    damaged = sorted(spooled)[len(spooled) // 2]
    path = agent.spool / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # power loss mid-write
    central.start()
    agent.start()
    wait_for("the spool to drain", drained(agent))
    assert agent.metric("fabricd_agent_spool_quarantined_total") == 1
    assert agent.metric("fabricd_agent_batches_dropped_total", reason="corrupt") == 1
    assert agent.term() == 0
    assert (agent.spool / "quarantine" / damaged).exists()
    assert "spooled batch quarantined" in agent.text() and "truncated" in agent.text()
    scrapes = set(assert_each_scrape_once(central, "node-1"))
    intact = set().union(*(ts for name, ts in spooled.items() if name != damaged))
    assert intact <= scrapes
    assert not spooled[damaged] & scrapes


def test_tls_with_a_custom_ca_and_a_wrong_ca_that_says_why(tmp_path: Path, procs: list[Proc]) -> None:
    tls = make_tls(tmp_path / "tls")
    central = Central(tmp_path, tls)
    good = Agent(tmp_path, central, "node-ok", FABRICD_TRANSPORT__CA_FILE=str(tls.ca))
    wrong = Agent(tmp_path, central, "node-wrong-ca", FABRICD_TRANSPORT__CA_FILE=str(tls.other_ca))
    procs += [central, good, wrong]
    central.start()
    good.start()
    wrong.start()
    wait_for("3 scrapes stored over TLS", lambda: len(central.scrapes("node-ok")) >= 3)
    wait_for("the wrong-CA agent to spool", lambda: wrong.metric("fabricd_agent_batches_spooled_total") >= 2)
    assert wrong.metric("fabricd_agent_batches_sent_total") == 0
    assert good.term() == 0 and wrong.term() == 0
    assert central.stored("node-wrong-ca") == {}
    assert "certificate verify failed" in wrong.text()
    assert gaps(assert_each_scrape_once(central, "node-ok")) == []
