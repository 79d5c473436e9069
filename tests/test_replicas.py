"""Three ``fabricd server`` replicas on one PostgreSQL and one NATS JetStream, one killed -9 mid-fault.

Real parts only: the local nats-server (127.0.0.1:4222, or one of the test's own when that one is
not running), the local PostgreSQL (a fresh schema), three replica processes, the simulator in
real time and twelve ``fabricd agent`` processes reading its counter files, half publishing to
NATS and half POSTing to a replica (which forwards to the bus). A lossy leaf-spine link is seen
by probes of nodes in every partition, so the incident needs the correlator's view of all of them.

During the fault the replica that is not the correlator and stores some node's partition is
killed -9, and once the incident is open, the correlator too. Afterwards:

* the partitions the first held are held by the others, then every partition and the correlator's
  lock by the last replica (its status API says so);
* counted per node, every batch an agent delivered (its closing log line, once it stopped with an
  empty spool) is stored, once, with exactly the points it carried; counted per series, no sample
  timestamp is stored twice;
* the incidents that began within the scenario are exactly those one engine yields over the same
  stored batches handed to it as they were stored (a single replica's detection: event time,
  settlement, the topology), packet loss among them, each listed once and alike by two replicas,
  each opened once across the correlator's death (the new one rebuilt its state from the store).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy
import yaml

from fabricd.bus import BusNames
from fabricd.sim import live
from fabricd.sim.demo import upload_topology
from fabricd.topology import to_doc
from tests.helpers import need_binary, skip_or_fail
from tests.support.points import raw_points
from tests.support.server import ServerProcess, free_port, pg_reachable, pg_schema

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SHARED_NATS = ("127.0.0.1", 4222)
PARTITIONS = 8
LEASE_SECONDS = 4.0
NODES = 12
FAULT = "leaf-02~spine-01"
# 5 s scrapes keep the run short; the lossy link starts at 50 s of the run (twelve agents take a
# loaded 2-core machine 20 s to start, then baselines need a few scrapes) and ends at 100 s.
SCENARIO = {
    "name": "replicas-lossy-link",
    "description": "A lossy leaf-spine link seen from every partition (tests/test_replicas.py).",
    "seed": 9,
    "duration": "120s",
    "interval": "5s",
    "topology": {"nodes": NODES, "hcas_per_node": 2, "nodes_per_leaf": 4, "spines": 2, "link_layer": "infiniband"},
    "workload": {"kind": "allreduce", "load": 0.6},
    "faults": [{"kind": "lossy_link", "at": FAULT, "start": "50s", "end": "100s", "severity": 0.7}],
}
# Every moment waits for every node: a loaded machine delays batches past the default lateness
# (7.5 s here), and a node left out of a moment changes what is detected there, as it would between
# two runs of a single central; waiting for all makes the incidents a function of the samples alone.
LATENESS_SECONDS = 60.0
KILL_AFTER_SECONDS = 60.0  # of the run: 10 s into the fault, before it is detected


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def nats_url(tmp_path: Path) -> Iterator[str]:
    """The machine's NATS JetStream, or a ``nats-server -js`` of the test's own when it is not running."""
    if _reachable(*SHARED_NATS):
        yield "nats://127.0.0.1:4222"
        return
    port = free_port()
    argv = [need_binary("nats-server"), "-js", "-sd", str(tmp_path / "js"), "-a", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(lambda: _reachable("127.0.0.1", port), 15, "nats-server did not start")
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def until(check: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


class Agent:
    def __init__(self, node: str, args: list[str], log: Path, metrics_port: int) -> None:
        self.node, self.metrics_port, self.log = node, metrics_port, log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fabricd", "agent", *args], stdout=out, stderr=subprocess.STDOUT
            )

    def metric(self, name: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def closed(self) -> tuple[int, int]:
        """(batches left in the spool, batches delivered in all) from the stopped agent's last words."""
        line = [x for x in self.log.read_text().splitlines() if 'msg="transport closed"' in x][-1]
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        return int(fields["spooled_batches"]), int(fields["sent_batches"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_agent(tmp_path: Path, sim: Any, node: str, central: str, bus: dict[str, Any] | None) -> Agent:
    port = free_port()
    config = {**sim.agent_config(node), "metrics_listen": f"127.0.0.1:{port}"}
    if bus is not None:
        config["bus"] = bus
    cfg = tmp_path / "agents" / f"{node}.yaml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(yaml.safe_dump(config))
    args = ["--central", central, "--node", node, "--sysfs-root", str(sim.sysfs_root(node))]
    args += ["--interval", str(sim.scenario.interval), "--data-dir", str(tmp_path / "agents" / node)]
    args += ["--config", str(cfg)]
    return Agent(node, args, tmp_path / "agents" / f"{node}.log", port)


def replica(tmp_path: Path, i: int, db: str, bus: dict[str, Any]) -> ServerProcess:
    cfg = tmp_path / f"replica-{i}.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "bus": bus,
                "replica": {"enabled": True, "id": f"r{i}", "lease_seconds": LEASE_SECONDS},
                "latest_flush_seconds": 1.0,
                "settlement": {"lateness_seconds": LATENESS_SECONDS},
            }
        )
    )
    return ServerProcess(tmp_path / f"replica-{i}", db=db, auth=False, extra=["--config", str(cfg)])


def status(url: str) -> dict[str, Any]:
    out: dict[str, Any] = httpx.get(f"{url}/api/v1/replicas", timeout=10).json()
    return out


def balanced(url: str, replicas: set[str]) -> dict[str, Any] | None:
    now = status(url)
    ok = set(now["replicas"]) == replicas and len(now["partitions"]) == PARTITIONS and now["correlator"]
    return now if ok and set(now["partitions"].values()) == replicas else None


def incidents(url: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = httpx.get(f"{url}/api/v1/incidents", params={"limit": 1000}, timeout=10).json()
    return rows


def test_three_replicas_one_killed_lose_nothing_store_nothing_twice_and_open_the_single_replica_incidents(
    tmp_path: Path,
) -> None:
    if not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    with nats_url(tmp_path) as url, pg_schema() as db:
        bus = {"url": url, "prefix": f"rep{uuid.uuid4().hex[:8]}", "partitions": PARTITIONS}
        names = BusNames(bus["prefix"], PARTITIONS)
        servers = [replica(tmp_path, i, db, bus) for i in range(3)]
        agents: list[Agent] = []
        sim: Any = None
        try:
            with concurrent.futures.ThreadPoolExecutor(3) as pool:  # a loaded machine takes seconds each
                list(pool.map(lambda s: s.start(60), servers))
            ids = {"r0", "r1", "r2"}
            before = until(lambda: balanced(servers[0].url, ids), 60, "partitions not spread over 3 replicas")
            sim = live.start(scenario, tmp_path / "sim", nodes=NODES)  # its clock starts now
            cluster = sim.cluster
            doc = to_doc(cluster.sim.fabric.topology, cluster.routes(), cluster.replies())
            upload_topology(servers[0].url, doc)
            # The first victim: not the correlator, and storing some node's partition; the second: the
            # correlator, once the incident is open; the third replica is never killed.
            held = {int(p): who for p, who in before["partitions"].items()}
            correlator_id = before["correlator"]
            victim_id = next(
                r for r in sorted(ids - {correlator_id}) if any(held[names.partition(n)] == r for n in sim.nodes)
            )
            (last_id,) = ids - {correlator_id, victim_id}
            by_id = {f"r{i}": s for i, s in enumerate(servers)}
            victim, correlator, last = by_id[victim_id], by_id[correlator_id], by_id[last_id]
            for i, node in enumerate(sim.nodes):  # half over NATS, half over HTTP to the replica kept
                agents.append(start_agent(tmp_path, sim, node, last.url, bus if i % 2 == 0 else None))
            until(lambda: time.time() > cluster.epoch + KILL_AFTER_SECONDS, 120, "the run did not reach the kill")
            kill(victim)  # SIGKILL: no shutdown, no release, unacknowledged batches in flight
            killed = time.monotonic()
            after = until(lambda: balanced(last.url, {correlator_id, last_id}), 60, "partitions not reassigned")
            takeover_seconds = time.monotonic() - killed
            # Read from both survivors: the same incidents, whichever replica answers.
            both = until(lambda: _listed_alike(correlator.url, last.url), 120, "no incident opened during the fault")
            statuses = [httpx.get(f"{u}/api/v1/status", timeout=10) for u in (correlator.url, last.url)]
            kill(correlator)
            alone = until(lambda: balanced(last.url, {last_id}), 60, "the last replica took over nothing")
            until(lambda: time.time() > cluster.epoch + sim.scenario.duration, 180, "the run did not end")
            sim.stop()
            quiet = lambda: not any(a.metric("fabricd_agent_spool_batches") for a in agents)  # noqa: E731
            until(quiet, 90, "an agent's spool did not drain")
            for a in agents:  # a graceful stop sends what is pending and says what it delivered in all
                a.stop()
            closed = {a.node: a.closed() for a in agents}
            sent = {node: delivered for node, (_spooled, delivered) in closed.items()}
            drained = until(lambda: _stored(db, sent), 60, "acknowledged batches are missing from the store")
            asked = time.time()
            rows = [httpx.get(f"{last.url}/api/v1/incidents/{r['id']}", timeout=10).json() for r in incidents(last.url)]
            # The fleet status answers on the correlator too (its cursor is one per partition).
            fleet = httpx.get(f"{last.url}/api/v1/status", timeout=10)
            assert fleet.status_code == 200, fleet.text
            assert fleet.json()["nodes"] == len(agents) and fleet.json()["detection_backlog_points"] >= 0
        finally:
            if sim is not None:
                sim.stop()
            for a in agents:
                a.stop()
            for s in servers:
                s.stop()
        print(f"takeover after kill -9: {takeover_seconds:.1f} s (lease {LEASE_SECONDS:g} s)")
        # Partitions reassigned: the first victim's to the survivors, then every one and the correlator's
        # lock to the last replica.
        lost = {p for p, who in held.items() if who == victim_id}
        assert lost and victim_id not in after["replicas"]
        assert set(after["partitions"].values()) == {correlator_id, last_id} and len(after["partitions"]) == PARTITIONS
        assert (alone["correlator"], set(alone["partitions"].values()), alone["replicas"]) == (
            last_id,
            {last_id},
            [last_id],
        )
        # The fleet status answers on the correlator and on a replica that only stores.
        assert [(r.status_code, r.json()["nodes"]) for r in statuses] == [(200, NODES), (200, NODES)]
        assert statuses[0].json()["detection_backlog_points"] is not None
        assert statuses[1].json()["detection_backlog_points"] is None
        # Nothing lost, nothing stored twice.
        stored, points, carried, twice = drained
        assert {node: spooled for node, (spooled, _) in closed.items()} == dict.fromkeys(sim.nodes, 0)
        assert stored == sent and set(sent) == set(sim.nodes) and all(sent.values())
        assert points == carried
        assert twice == []
        # Incidents: exactly a single engine's over the same samples, each once and opened once, across
        # the correlator's death too (one "opened" in each timeline, never reopened). The fault is found
        # as packet loss; where the engine places it is the detector's business (on this loaded machine
        # it placed the link's spine once in fourteen runs, a single engine alike), not the replicas'.
        # What began within the scenario: afterwards the simulator is stopped, its counters frozen,
        # while the agents deliver what is left.
        ended = cluster.epoch + sim.scenario.duration
        rows = [r for r in rows if r["started_ts"] < ended]
        opened = {(r["kind"], r["element"]) for r in rows}
        single = single_engine(db, doc, asked, ended)
        print("batches per node:", sent)
        print("incidents:", [(r["kind"], r["element"], [e["what"] for e in r["timeline"]]) for r in rows])
        print("one engine over the same samples:", sorted(single))
        keys = [r["key"] for r in rows]
        assert len(keys) == len(set(keys)) == len(opened)
        assert "packet_loss" in {kind for kind, _ in opened}
        assert opened == single
        for row in rows:
            notes = [entry["what"].split(":")[0] for entry in row["timeline"]]
            assert notes.count("opened") == 1 and "reopened" not in notes, row["key"]
        assert {key for key, _ in both} <= set(keys)


def _listed_alike(*urls: str) -> list[tuple[str, str]] | None:
    listed = [sorted((r["key"], r["state"]) for r in incidents(url)) for url in urls]
    return listed[0] if listed[0] and all(x == listed[0] for x in listed) else None


def kill(server: ServerProcess) -> None:
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait()


def _stored(db: str, sent: dict[str, int]) -> tuple[Any, ...] | None:
    """(batches stored per node, points stored per node, points the stored batches carried per node,
    series with a timestamp stored twice) once every node has as many batches stored as its agent
    had acknowledged (the bus acknowledges before a replica stores); None until then."""
    engine = sqlalchemy.create_engine(db)
    try:
        with engine.connect() as conn:
            q = conn.execute
            stored = {
                n: int(c) for n, c in q(sqlalchemy.text("SELECT node, count(*) FROM ingested_batches GROUP BY node"))
            }
            if stored != sent:
                return None
            carried = {
                n: int(c)
                for n, c in q(sqlalchemy.text("SELECT node, sum(samples) FROM ingested_batches GROUP BY node"))
            }
            raw = raw_points(engine)  # the batches' chunks, unpacked
            node_of = dict(q(sqlalchemy.text("SELECT id, node FROM series")).all())
            points = dict(Counter(node_of[p[1]] for p in raw))
            twice = [key for key, n in Counter((p[1], p[2]) for p in raw).items() if n > 1]
    finally:
        engine.dispose()
    return stored, points, carried, twice


def single_engine(db: str, doc: dict[str, Any], until_ts: float, began_before: float) -> set[tuple[str, str]]:
    """The incidents that began before ``began_before`` which one detection engine opens in one
    process over the stored batches, each handed to it when it was stored (``received_ts``), as a
    single central's detection loop reads them: the same settlement, event time and topology, up to
    ``until_ts`` (when the replicas were asked)."""
    from fabricd.detect.engine import DetectionEngine
    from fabricd.detect.settle import SettleParams
    from fabricd.server.detection import EngineFeed
    from fabricd.server.store.storage import Storage
    from fabricd.topology import from_doc, replies_of, routes_of

    engine = DetectionEngine()
    topology = from_doc(doc)
    routes = routes_of(doc, topology)
    engine.set_topology(topology, routes or None, replies_of(doc, topology, routes))
    feed = EngineFeed(engine, SettleParams(lateness_seconds=LATENESS_SECONDS))
    store = Storage.open(sqlalchemy.create_engine(db))
    try:
        deliveries, _ = store.stream.read(0, 10_000_000)  # every stored raw point, in id order
        with store.engine.connect() as conn:
            batches = conn.execute(
                sqlalchemy.text("SELECT node, received_ts, samples FROM ingested_batches ORDER BY id")
            ).all()
    finally:
        store.engine.dispose()
    points: dict[str, list[Any]] = {}
    for d in deliveries:
        points.setdefault(d.node, []).extend(d.samples)
    handed: list[tuple[float, str, list[Any]]] = []
    taken: dict[str, int] = {}
    for node, received_ts, count in batches:  # a node's batches are stored in id order, points too
        start = taken.get(node, 0)
        taken[node] = start + count
        handed.append((received_ts, node, points[node][start : start + count]))
    found = []
    for received_ts, node, samples in sorted(handed, key=lambda h: h[0]):
        feed.detection.offer(node, samples, received_ts)
        found += feed.detection.tick(received_ts)
    found += feed.detection.tick(until_ts)
    return {(i.kind.value, i.element) for i in found if i.started_ts < began_before}
