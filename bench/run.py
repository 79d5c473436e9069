"""``make bench``: fabricd measured against node_exporter and against the machine's own limits.

Every figure is the median of several runs after a warm-up (min and max kept), and each ratio is
computed between two measurements taken in the same run. The table goes to stdout and to
``docs/benchmarks.md`` (with the machine and the commit); the JSON to ``bench-results/latest.json``
so two runs can be compared (``--compare OLD.json``). No timing is asserted anywhere: a benchmark
fails only on a broken setup.

    python bench/run.py [--quick | --smoke] [--only scrape,exposition,footprint,ingest,transport,detect] [--no-docs]

``--smoke`` runs every section at toy sizes, once: the test suite uses it to prove the harness
works (its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_metrics import bench_central_page, bench_exposition
from loadgen import post_all
from measure import Stat, free_port, pid_cpu_seconds, pid_rss_bytes, postgres_cpu_seconds, run_child

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
Row = dict[str, Any]


# --------------------------------------------------------------------------- the node under test


def write_node_tree(root: Path) -> Path:
    """A realistic GPU node: 8 ConnectX-7 HCAs (IB: counters + hw_counters) and a RoCE bond
    (Ethernet: counters + hw_counters with the congestion counters), written with the same tree
    writer the simulator uses (fabricd/sim/sysfstree.py: the files and formats of the real fixtures)."""
    from fabricd.sim import sysfstree as st

    def counters() -> dict[str, st.Value]:
        vals: dict[str, st.Value] = {name: 3 for name in st.PORT_COUNTERS_BASE}
        vals.update({name: 123_456_789_012 for name in st.PORT_COUNTERS_DATA + st.PORT_COUNTERS_EXT_ONLY})
        return vals

    hw = {name: 42 for name in st.MLX5_Q_COUNTERS}
    devices = {
        f"mlx5_{i}": st.DeviceTree(
            node_guid=f"a088:c203:00{i:02x}:1e2c",
            ports={"1": st.PortTree(counters=counters(), hw_counters={**hw, "lifespan": 12})},
        )
        for i in range(8)
    }
    devices["mlx5_bond_0"] = st.DeviceTree(
        hca_type="MT41692",
        ports={
            "1": st.PortTree(
                link_layer="Ethernet",
                rate="200 Gb/sec (2X NDR)",
                counters=counters(),
                hw_counters={**hw, **{name: 7 for name in st.MLX5_CONG_COUNTERS}, "lifespan": 12},
            )
        },
    )
    st.write_infiniband_tree(root, devices)
    return root


def counter_file_count(root: Path) -> int:
    sys.path.insert(0, str(REPO / "bench"))
    from floor import counter_files

    return len(counter_files(str(root)))


# --------------------------------------------------------------------------- 1. scrape cost


def _fabricd_collect_cpu(root: Path, count: int) -> float:
    argv = [
        PY,
        "-m",
        "fabricd",
        "collect",
        "--count",
        str(count),
        "--interval",
        "0",
        "--format",
        "none",
        "--sysfs-root",
        str(root),
        "--collector",
        "infiniband",
    ]
    return run_child(argv).cpu_seconds


def fabricd_per_scrape(root: Path, n: int) -> float:
    # Startup (interpreter, imports, discovery) is subtracted: count=n+1 minus count=1.
    return (_fabricd_collect_cpu(root, n + 1) - _fabricd_collect_cpu(root, 1)) / n


def floor_per_scrape(root: Path, n: int) -> float:
    full = run_child([PY, str(REPO / "bench" / "floor.py"), str(root), str(n)]).cpu_seconds
    base = run_child([PY, str(REPO / "bench" / "floor.py"), str(root), "0"]).cpu_seconds
    return (full - base) / n


class NodeExporter:
    """The Debian prometheus-node-exporter with only its infiniband collector, on a free port."""

    def __init__(self, root: Path, headers: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                "prometheus-node-exporter",
                f"--path.sysfs={root}",
                "--collector.disable-defaults",
                "--collector.infiniband",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.client = httpx.Client(headers=headers or {"Accept-Encoding": "identity"})
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                self.scrape()
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("node_exporter did not start")

    def scrape(self) -> None:
        self.client.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).raise_for_status()

    def per_scrape(self, n: int) -> float:
        before = pid_cpu_seconds(self.proc.pid)
        for _ in range(n):
            self.scrape()
        return (pid_cpu_seconds(self.proc.pid) - before) / n

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(10)


def bench_scrape(mode: str) -> list[Row]:
    # fabricd's per-scrape figure subtracts a startup of ~0.7 s CPU that varies by tens of ms on a
    # shared machine: at 50 scrapes (~0.1 s) that noise made single runs negative, at 300 it is a
    # few percent. node_exporter's CPU is read in 10 ms ticks, so it needs the scrapes too.
    n, runs = {"smoke": (20, 1), "quick": (300, 5), "full": (1000, 5)}[mode]
    with tempfile.TemporaryDirectory() as tmp:
        root = write_node_tree(Path(tmp))
        files = counter_file_count(root)
        ne = NodeExporter(root)
        try:
            pairs = []
            for _ in range(runs + 1):  # the first pair is the warm-up
                pairs.append((fabricd_per_scrape(root, n), ne.per_scrape(n), floor_per_scrape(root, n)))
        finally:
            ne.close()
    pairs = pairs[1:]
    fab, nex, flo = (Stat.of([p[i] for p in pairs]) for i in range(3))
    ratio = Stat.of([p[0] / p[1] for p in pairs if p[1] > 0])
    ratio_floor = Stat.of([p[0] / p[2] for p in pairs if p[2] > 0])
    note = f"{files} counter files, {n} scrapes per run"
    return [
        _row("scrape", "fabricd collect, CPU per scrape", fab, "s", note),
        _row("scrape", "node_exporter (infiniband only), CPU per scrape", nex, "s", note + ", over HTTP"),
        _row("scrape", "bare Python open+read of every counter file", flo, "s", "the floor"),
        _row("scrape", "ratio fabricd / node_exporter", ratio, "x", "goal <= 0.5"),
        _row("scrape", "ratio fabricd / bare-Python floor", ratio_floor, "x", ""),
    ]


# --------------------------------------------------------------------------- 2. agent footprint


def bench_footprint(mode: str) -> list[Row]:
    seconds, warm_up = {"smoke": (2, 2), "quick": (15, 5), "full": (60, 5)}[mode]
    with tempfile.TemporaryDirectory() as tmp:
        root = write_node_tree(Path(tmp) / "sys")
        # No central: the agent spools, which is its worst steady state (it also serializes to disk).
        proc = subprocess.Popen(
            [
                PY,
                "-m",
                "fabricd",
                "agent",
                "--node",
                "bench",
                "--sysfs-root",
                str(root),
                "--interval",
                "1",
                "--central",
                f"http://127.0.0.1:{free_port()}",
                "--data-dir",
                str(Path(tmp) / "data"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(warm_up)  # imports, discovery, first batches
            cpu0, t0 = pid_cpu_seconds(proc.pid), time.monotonic()
            time.sleep(seconds)
            cpu = (pid_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
            rss = pid_rss_bytes(proc.pid)
        finally:
            proc.terminate()
            proc.wait(15)
    return [
        _row(
            "footprint",
            "fabricd agent steady CPU at 1 s interval",
            Stat.of([cpu * 100]),
            "%",
            f"over {seconds} s, central down (spooling)",
        ),
        _row("footprint", "fabricd agent peak RSS", Stat.of([rss / 2**20]), "MiB", ""),
    ]


# --------------------------------------------------------------------------- 3. central ingest


# The service's latest-values flush period in these rows (its default is 30 s). A finite run ends
# by waiting for the flush that follows its last batch: with a period of 1 s that was the timer's
# phase (0-1 s of an idle wait) and then one flush of every node written in the last second,
# neither of which a fleet that never stops waits for. At 0.1 s the wait and that last flush are a
# tenth, while each node's row is still written once a scrape (its one batch) and the flush's own
# cost is measured in full: more, smaller transactions, never fewer writes. Alternated with 1 s,
# 2026-12-07 (AMD EPYC, slow phase): SQLite 1,000 nodes first 3 scrapes 103-112k -> 118-131k
# samples/s, the next 2 163-166k -> 181-212k; PostgreSQL 500 nodes 75-89k -> 85-100k and 95-120k
# -> 109-150k (docs/benchmarks.md).
LATEST_FLUSH_SECONDS = 0.1
COUNTERS_PER_PORT = 60
PORTS_PER_NODE = 8


def fleet_batches(nodes: int, scrapes: int, t0: float = 1_700_000_000.0) -> list[Any]:
    """Batches as ``nodes`` agents would send them: 8 ports x 60 counters each, one per scrape."""
    from fabricd.model import Batch, Kind, Reading, Sample

    batches = []
    for k in range(scrapes):
        ts = t0 + 10.0 * k
        for n in range(nodes):
            samples = [
                Sample(
                    ts,
                    Reading(
                        "infiniband", f"mlx5_{p}", "1", f"counter_{c:02d}", float(k * 1000 + c), "packets", Kind.COUNTER
                    ),
                    rate=float(c),
                )
                for p in range(PORTS_PER_NODE)
                for c in range(COUNTERS_PER_PORT)
            ]
            batches.append(
                Batch(f"node-{n:04d}", "bench", f"b-{n}-{k}", samples, created_ts=ts, instance=f"bench-{n}", seq=k + 1)
            )
    return batches


def _bare_rows(batches: list[Any]) -> list[list[tuple[Any, ...]]]:
    return [
        [(hash((b.node, s.reading.key())) & 0xFFFFFF, s.ts, s.reading.value, s.rate, s.status.value) for s in b.samples]
        for b in batches
    ]


def _bare_connect(url: str) -> tuple[Any, str]:
    """A plain DBAPI connection with the service's settings (fabricd/server/db.py), and its placeholder."""
    import sqlite3

    if url.startswith("sqlite"):
        conn: Any = sqlite3.connect(url.removeprefix("sqlite:///"))
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")  # as the service: acknowledged = durable
        return conn, "?"
    import psycopg

    return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")), "%s"


def _insert_like_service(cur: Any, ph: str, rows: list[tuple[Any, ...]]) -> None:
    """The DBAPI method the service used for a row a point, before it stored a chunk a batch
    (migrations 0008 and 0011): on SQLite, multi-row ``INSERT .. VALUES (..), (..)`` in power-of-two
    chunks of at most 512 rows (still its method for new series); on PostgreSQL, ``COPY .. FROM
    STDIN (FORMAT BINARY)`` (still its method for folded points)."""
    if ph == "%s":
        with cur.copy("COPY bare_points (series_id, ts, value, rate, status) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "float8", "float8", "float8", "text"])
            for row in rows:
                copy.write_row(row)
        return
    start = 0
    while start < len(rows):
        size = min(512, 1 << ((len(rows) - start).bit_length() - 1))
        values = ", ".join([f"({ph}, {ph}, {ph}, {ph}, {ph})"] * size)
        cur.execute(
            f"INSERT INTO bare_points (series_id, ts, value, rate, status) VALUES {values}",
            [x for row in rows[start : start + size] for x in row],
        )
        start += size


def bare_insert(batches: list[Any], url: str, method: str) -> float:
    """The floor: the same rows into one table (no secondary index), one transaction per batch, with
    ``executemany`` (the issue's baseline) or ``service`` (the service's own DBAPI method)."""
    rows_per_batch = _bare_rows(batches)
    total = sum(len(r) for r in rows_per_batch)
    conn, ph = _bare_connect(url)
    conn.execute("DROP TABLE IF EXISTS bare_points")
    conn.execute(
        "CREATE TABLE bare_points (id INTEGER PRIMARY KEY, series_id INTEGER, ts REAL, value REAL, "
        "rate REAL, status TEXT)"
        if ph == "?"
        else "CREATE TABLE bare_points (id BIGSERIAL PRIMARY KEY, series_id BIGINT, ts DOUBLE PRECISION, "
        "value DOUBLE PRECISION, rate DOUBLE PRECISION, status TEXT)"
    )
    conn.commit()
    sql = f"INSERT INTO bare_points (series_id, ts, value, rate, status) VALUES ({ph}, {ph}, {ph}, {ph}, {ph})"
    start = time.perf_counter()
    for rows in rows_per_batch:
        cur = conn.cursor()
        if method == "executemany":
            cur.executemany(sql, rows)
        else:
            _insert_like_service(cur, ph, rows)
        conn.commit()
    elapsed = time.perf_counter() - start
    conn.close()
    return total / elapsed


def wait_ready(url: str, what: str, timeout: float = 30.0) -> None:
    """Until ``url``'s ``/readyz`` answers 200 (a server just started), or raise naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not become ready")


class Central:
    """A real ``fabricd server`` subprocess on a free port (auth off: the load generator is trusted)."""

    def __init__(self, data_dir: Path, db: str | None = None, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        argv = [
            PY,
            "-m",
            "fabricd",
            "server",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--data-dir",
            str(data_dir),
            "--no-auth",
            "--log-level",
            "warning",
        ]
        if db:
            argv += ["--db", db]
        # Latest values written every LATEST_FLUSH_SECONDS (the default is 30 s): each point's
        # latest value is then written about once, as when every point updated its series row,
        # and the ingest time below waits for the last write (``wait_caught_up``).
        full = {**os.environ, "FABRICD_LATEST_FLUSH_SECONDS": str(LATEST_FLUSH_SECONDS), **(env or {})}
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=full)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_ready(self.url, "fabricd server")

    def wait_caught_up(self, timeout: float = 300.0) -> None:
        """Until every latest value the service holds in memory is written to the database and the
        detectors have processed every stored point: ingest is done when both are."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = httpx.get(f"{self.url}/api/v1/status", timeout=60).json()
            if status["latest_unflushed_series"] == 0 and status["detection_backlog_points"] == 0:
                return
            time.sleep(0.05)
        raise RuntimeError("fabricd server did not write its latest values or catch up with detection")

    def wait_stored(self, url: str, points: int, timeout: float = 300.0) -> None:
        """Until the database at ``url`` holds ``points`` points (a consumer pulling from the bus
        has no request to wait on), then until caught up as above."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _points_in(url) >= points:
                self.wait_caught_up(max(1.0, deadline - time.monotonic()))
                return _check_points(url, points)
            time.sleep(0.05)
        raise RuntimeError(f"fabricd server did not store {points} points from the bus")

    def close(self) -> None:
        # A correlator stops after its detection step's query: catching up from the first point of
        # a fresh database (no planner statistics yet), one partition's read took 20 s and more.
        self.proc.terminate()
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:  # never leave it running: the next rows would share its core
            self.proc.kill()
            self.proc.wait()
            print(f"bench: fabricd server {self.proc.pid} ignored SIGTERM for 120 s; killed", file=sys.stderr)


def _points_in(url: str, exact: bool = False) -> int:
    """Points stored, as the nodes' ingest counters say (committed with the points); ``exact``
    counts the table. Polled every 50 ms, ``count(*)`` over a million points cost PostgreSQL most
    of a core on this 2-core machine, taken from the service being measured."""
    conn, _ph = _bare_connect(url)
    # Raw points are chunks, one row per batch (fabricd/server/store/chunks.py).
    raw = "SELECT coalesce(sum(count), 0) FROM point_chunks"
    sql = raw if exact else "SELECT coalesce(sum(samples), 0) FROM nodes"
    try:
        return int(conn.execute(sql).fetchone()[0])
    except Exception:  # the schema is not there yet
        return 0
    finally:
        conn.close()


def _check_points(url: str, total: int) -> None:
    if (got := _points_in(url, exact=True)) != total:
        raise RuntimeError(f"the counters said {total} points were stored, the table holds {got}")


def _metrics_render_seconds(url: str, runs: int) -> Stat:
    def once() -> float:
        start = time.perf_counter()
        httpx.get(f"{url}/metrics", timeout=120).raise_for_status()
        return time.perf_counter() - start

    once()
    return Stat.of([once() for _ in range(runs)])


def _postgres_url(run: int) -> str | None:
    """A fresh database per run: equal table sizes, and no batch id left from an earlier run (the
    service would acknowledge those as duplicates without storing them)."""
    try:
        import psycopg

        name = f"fabricd_bench_{os.getpid()}_{run}"
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    except Exception as exc:
        print(f"bench: PostgreSQL unavailable ({exc}); skipping its rows", file=sys.stderr)
        return None


def _drop_postgres(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


STEADY_SCRAPES = 2  # timed after the ingest row's scrapes: the fleet's steady state


def http_floor(bodies: list[bytes], samples: int) -> dict[str, float]:
    """The same bodies posted the same way to ``bench/http_floor.py`` (uvicorn and FastAPI with a
    handler that stores nothing): samples/s, and CPU µs per sample of that server and of this load
    generator (``loadgen.py``, on the same cores as the server it measures)."""
    port = free_port()
    proc = subprocess.Popen([PY, str(REPO / "bench" / "http_floor.py"), str(port)], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, "bench/http_floor.py")
        cpu, mine = pid_cpu_seconds(proc.pid), time.process_time()
        wall = post_all(url, bodies)
        return {
            "floor": samples / wall,
            "floor_cpu": (pid_cpu_seconds(proc.pid) - cpu) / samples * 1e6,
            "client_cpu": (time.process_time() - mine) / samples * 1e6,
        }
    finally:
        proc.terminate()
        proc.wait(30)


def _ingest_run(db_label: str, nodes: int, scrapes: int, run: int, tmp: Path, render: bool) -> dict[str, float] | None:
    """One run: the service, then the two bare baselines on the same backend; samples/s each."""
    from fabricd.wire import encode

    db = None
    if db_label == "PostgreSQL" and (db := _postgres_url(run)) is None:
        return None
    # Event times just behind the wall clock: /metrics exports only series seen in the last
    # metrics_stale_seconds (300 s), so older times would time an empty fleet.
    every = fleet_batches(nodes, scrapes + STEADY_SCRAPES, t0=time.time() - 10.0 * (scrapes + STEADY_SCRAPES))
    batches = every[: nodes * scrapes]  # the timed fleet, its first scrape creating the series
    bodies = [encode(b) for b in every]  # agents encode on their own CPUs: not timed
    total = nodes * scrapes * PORTS_PER_NODE * COUNTERS_PER_PORT
    steady = nodes * STEADY_SCRAPES * PORTS_PER_NODE * COUNTERS_PER_PORT
    data = tmp / f"{db_label}-{run}"
    url = db or f"sqlite:///{data / 'fabricd.db'}"
    out: dict[str, float] = {}
    central = Central(data, db)
    try:
        database_cpu = postgres_cpu_seconds if db is not None else lambda: 0.0
        start, server = time.perf_counter(), database_cpu()
        post_all(central.url, bodies[: len(batches)])
        central.wait_caught_up()
        out["service"] = total / (time.perf_counter() - start)
        cpu, server_after = pid_cpu_seconds(central.proc.pid), database_cpu()
        out["postgres_cpu"] = (server_after - server) / total * 1e6
        start = time.perf_counter()  # then the same fleet's next scrapes: every series exists
        post_all(central.url, bodies[len(batches) :])
        central.wait_caught_up()
        out["steady"] = steady / (time.perf_counter() - start)
        out["steady_cpu"] = (pid_cpu_seconds(central.proc.pid) - cpu) / steady * 1e6
        out["steady_postgres_cpu"] = (database_cpu() - server_after) / steady * 1e6
        if render:
            out["render"] = _metrics_render_seconds(central.url, 3).median
    finally:
        central.close()
    if db is None:  # the transport's floor does not depend on the database: measured once a run
        out.update(http_floor(bodies[len(batches) :], steady))
    out["executemany"] = bare_insert(batches, url, "executemany")
    out["service_method"] = bare_insert(batches, url, "service")
    if db is not None:
        _drop_postgres(db)
    return out


def _ingest_on(db_label: str, nodes: int, scrapes: int, runs: int, tmp: Path) -> list[Row]:
    results = []
    for run in range(runs + 1):  # run 0 is the warm-up
        r = _ingest_run(db_label, nodes, scrapes, run, tmp, render=db_label == "SQLite" and run > 0)
        if r is None:
            return []
        results.append(r)
    results = results[1:]
    service = [r["service"] for r in results]
    note = f"{nodes} nodes x {PORTS_PER_NODE} ports x {COUNTERS_PER_PORT} counters x {scrapes} scrapes"
    rows = [
        _row(
            "ingest",
            f"central ingest, {db_label}",
            Stat.of(service),
            "samples/s",
            note + f", 8 agents in flight, until detection has caught up and latest values are "
            f"written (every {LATEST_FLUSH_SECONDS:g} s)",
        ),
        _row(
            "ingest",
            f"central ingest at steady state, {db_label}",
            Stat.of([r["steady"] for r in results]),
            "samples/s",
            f"the same fleet's next {STEADY_SCRAPES} scrapes, after the row above: every series exists, as in a "
            "fleet running for a while",
        ),
        _row(
            "ingest",
            f"central CPU per sample at steady state, {db_label}",
            Stat.of([r["steady_cpu"] for r in results]),
            "µs",
            "the server process's CPU over the row above"
            + ("" if db_label == "SQLite" else " (PostgreSQL's own processes not counted)"),
        ),
        *(_postgres_rows(results) if db_label == "PostgreSQL" else []),
        _row(
            "ingest",
            f"bare executemany, {db_label}",
            Stat.of([r["executemany"] for r in results]),
            "samples/s",
            "same rows, one txn per batch, one table",
        ),
        _row(
            "ingest",
            f"bare, service's DBAPI method, {db_label}",
            Stat.of([r["service_method"] for r in results]),
            "samples/s",
            "as above; "
            + ("VALUES (..),(..) x512" if db_label == "SQLite" else "COPY binary")
            + ", a row a point: the service's row method before raw points became chunks (0008, 0011)",
        ),
        _row(
            "ingest",
            f"ratio central / bare executemany, {db_label}",
            Stat.of([r["service"] / r["executemany"] for r in results]),
            "x",
            "the service's overhead",
        ),
        _row(
            "ingest",
            f"ratio central / bare with the service's method, {db_label}",
            Stat.of([r["service"] / r["service_method"] for r in results]),
            "x",
            "same DBAPI method on both sides",
        ),
    ]
    if db_label == "SQLite":
        rows += _floor_rows(results)
        rows.append(
            _row(
                "exporter",
                f"/metrics render, {nodes}-node fleet",
                Stat.of([r["render"] for r in results]),
                "s",
                f"the default (bounded) page of a fleet of {nodes * PORTS_PER_NODE * COUNTERS_PER_PORT} fresh series; "
                "the full fleet view is opt-in",
            )
        )
    return rows


def _postgres_rows(results: list[dict[str, float]]) -> list[Row]:
    """PostgreSQL's own CPU a sample beside the central's: on the bench machine both share its
    cores, so the database's share bounds the ingest rows as much as the service's does."""
    note = "every postgres process's CPU (/proc) over the row, per sample stored"
    return [
        _row(
            "ingest",
            "PostgreSQL CPU per sample, first scrapes",
            Stat.of([r["postgres_cpu"] for r in results]),
            "µs",
            note + " (the central ingest row: its first scrape creates the series)",
        ),
        _row(
            "ingest",
            "PostgreSQL CPU per sample at steady state",
            Stat.of([r["steady_postgres_cpu"] for r in results]),
            "µs",
            note + " (the steady-state row)",
        ),
    ]


def _floor_rows(results: list[dict[str, float]]) -> list[Row]:
    """What HTTP alone costs on this machine, beside the ingest rows (the same bodies, the same
    client): the ceiling any HTTP ingest in one Python process meets here."""
    return [
        _row(
            "ingest",
            "HTTP floor: uvicorn + FastAPI, a handler storing nothing",
            Stat.of([r["floor"] for r in results]),
            "samples/s",
            "the steady-state bodies posted as above to bench/http_floor.py (body read, one thread hop, a JSON answer)",
        ),
        _row(
            "ingest",
            "HTTP floor, server CPU per sample",
            Stat.of([r["floor_cpu"] for r in results]),
            "µs",
            "the floor server's process CPU",
        ),
        _row(
            "ingest",
            "load generator CPU per sample",
            Stat.of([r["client_cpu"] for r in results]),
            "µs",
            "bench/loadgen.py posting to the floor (pre-built requests): it shares the cores with the server it measures",
        ),
        _row(
            "ingest",
            "ratio central at steady state / HTTP floor, SQLite",
            Stat.of([r["steady"] / r["floor"] for r in results]),
            "x",
            "the share of HTTP's own ceiling the service reaches",
        ),
    ]


def bench_ingest(mode: str) -> list[Row]:
    # Several scrapes: the first of each node creates its series, the rest are the steady state.
    nodes, scrapes, runs = {"smoke": (10, 2, 1), "quick": (100, 6, 2), "full": (1000, 3, 3)}[mode]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        rows += _ingest_on("SQLite", nodes, scrapes, runs, Path(tmp))
        rows += _ingest_on("PostgreSQL", max(nodes // 2, 10), scrapes, runs, Path(tmp))
    return rows


def bench_transport(mode: str) -> list[Row]:
    """The agent's transport pushing to a real local central (bench/transport_bench.py)."""
    batches, runs = {"smoke": (5, 1), "quick": (50, 2), "full": (200, 3)}[mode]
    results = []
    for _ in range(runs):
        proc = subprocess.run(
            [PY, str(REPO / "bench" / "transport_bench.py"), "--batches", str(batches), "--samples", "1000"],
            capture_output=True,
            text=True,
            check=True,
            timeout=900,
        )
        results.append(json.loads(proc.stdout))
    note = f"{batches} batches x 1000 samples, msgpack+gzip, central on SQLite"
    return [
        _row(
            "transport",
            "agent -> central batches/s",
            Stat.of([r["agent"]["batches_per_second"] for r in results]),
            "batches/s",
            note,
        ),
        _row(
            "transport",
            "agent -> central samples/s",
            Stat.of([r["agent"]["samples_per_second"] for r in results]),
            "samples/s",
            "acknowledged end to end",
        ),
        _row(
            "transport",
            "agent encode alone",
            Stat.of([r["encode"]["batches_per_second"] for r in results]),
            "batches/s",
            "the agent's CPU ceiling, no network",
        ),
    ]


# --------------------------------------------------------------------------- 4. detection


def _eval(scenario: str) -> dict[str, Any]:
    proc = subprocess.run(
        [PY, "-m", "fabricd", "eval", scenario, "--json"], capture_output=True, text=True, check=True, timeout=1800
    )
    return dict(json.loads(proc.stdout)["scenarios"][scenario])


def bench_detect(mode: str) -> list[Row]:
    runs = 3 if mode == "full" else 1
    rows: list[Row] = []
    for scenario in ("clean-ib",) if mode == "smoke" else ("mixed", "large"):
        results = [_eval(scenario) for _ in range(runs)]
        r0 = results[0]
        note = f"{r0['scrapes']:,} node scrapes, {r0['samples']:,} samples"
        rows.append(
            _row(
                "detect",
                f"samples/s through the detectors ({scenario})",
                Stat.of([r["samples"] / r["detect_seconds"] for r in results]),
                "samples/s",
                note,
            )
        )
        rows.append(
            _row(
                "detect",
                f"fabricd eval wall time ({scenario})",
                Stat.of([r["wall_seconds"] for r in results]),
                "s",
                "collectors + rates + settlement + detection, live-faithful delivery, in-process"
                + (", 256 nodes, 1 simulated hour" if scenario == "large" else ""),
            )
        )
    return rows


# --------------------------------------------------------------------------- 6. one replica, the bus


def _sqlite_db(run: int, tmp: Path) -> tuple[str, Callable[[], None]]:
    return f"sqlite:///{tmp / f'replica-{run}' / 'fabricd.db'}", lambda: None


def _postgres_db(run: int, tmp: Path) -> tuple[str, Callable[[], None]]:
    url = _postgres_url(1000 + run)
    if url is None:
        raise RuntimeError("PostgreSQL unavailable")
    return url, lambda: _drop_postgres(url)


def _stage_rows(db_label: str, results: list[dict[str, float]], note: str) -> list[Row]:
    from pipeline import LEARNING_SCRAPES, STAGES

    rows = [
        _row("replica", f"CPU per sample, {stage}, {db_label}", Stat.of([r[stage] for r in results]), "µs", note)
        for stage in STAGES
    ]
    rows.append(
        _row(
            "replica",
            f"detection samples/s per core, {db_label}",
            Stat.of([1e6 / r["detect"] for r in results]),
            "samples/s",
            "the stream read, settlement and DetectionEngine, thread CPU, every scrape; goal >= 1,500,000",
        )
    )
    rows.append(
        _row(
            "replica",
            f"detection samples/s per core at steady state, {db_label}",
            Stat.of([1e6 / r["detect_steady"] for r in results]),
            "samples/s",
            f"as above, the scrapes after each node's first {LEARNING_SCRAPES} (learned once); goal >= 1,500,000",
        )
    )
    if "correlator_read" in results[0]:
        rows += _correlator_rows(results)
    totals = [sum(r[s] for s in STAGES) for r in results]
    rows.append(
        _row("replica", f"CPU per sample, all three, {db_label}", Stat.of(totals), "µs", "decode + store + detect")
    )
    rows.append(
        _row(
            "replica",
            f"samples/s per core from CPU, {db_label}",
            Stat.of([1e6 / t for t in totals]),
            "samples/s",
            "1e6 / the sum: one replica's core doing only these three (no HTTP, no bus)",
        )
    )
    return rows


def _correlator_rows(results: list[dict[str, float]]) -> list[Row]:
    """The correlator's CPU a sample among replicas (PostgreSQL): what sizes it (docs/operations.md)."""
    note = "the same stored fleet read back by bus partition (PartitionedStream), thread CPU"
    return [
        _row(
            "replica",
            "correlator CPU per sample, partition read-back, PostgreSQL",
            Stat.of([r["correlator_read"] for r in results]),
            "µs",
            note,
        ),
        _row(
            "replica",
            "correlator CPU per sample, detectors, PostgreSQL",
            Stat.of([r["correlator_detect"] for r in results]),
            "µs",
            note + ": the service's detector stack on what the read hands it",
        ),
    ]


def _via_bus(nodes: int, scrapes: int, run: int, tmp: Path, db_label: str) -> dict[str, float]:
    """One run: the bus alone (nats-py), then a central on ``db_label`` consuming the same batches."""
    import bus

    from fabricd.wire import encode

    batches = fleet_batches(nodes, scrapes, t0=time.time() - 10.0 * scrapes)
    bodies = [encode(b) for b in batches]
    total = nodes * scrapes * PORTS_PER_NODE * COUNTERS_PER_PORT
    out = {f"bare_{k}": v for k, v in bus.bare(batches, bodies).items()}
    url, cleanup = (_sqlite_db if db_label == "SQLite" else _postgres_db)(run, tmp)
    stream = bus.prefix()
    env = {"FABRICD_BUS__URL": bus.NATS_URL, "FABRICD_BUS__PREFIX": stream}
    central = Central(tmp / f"bus-{db_label}-{run}", None if db_label == "SQLite" else url, env)
    if db_label == "SQLite":
        url = f"sqlite:///{tmp / f'bus-{db_label}-{run}' / 'fabricd.db'}"
    try:
        deadline = time.monotonic() + 30
        while not _stream_exists(stream) and time.monotonic() < deadline:
            time.sleep(0.1)
        start = time.perf_counter()
        bus.publish_all(stream, batches, bodies)
        central.wait_stored(url, total)
        out["central"] = total / (time.perf_counter() - start)
    finally:
        central.close()
        bus.delete_stream(stream)
        cleanup()
    return out


def _stream_exists(stream_prefix: str) -> bool:
    import asyncio

    import nats

    from fabricd.bus import BusNames

    async def go() -> bool:
        nc = await nats.connect(servers=["nats://127.0.0.1:4222"], connect_timeout=5)
        try:
            await nc.jetstream().stream_info(BusNames(stream_prefix).stream)
            return True
        except nats.js.errors.NotFoundError:
            return False
        finally:
            await nc.close()

    return asyncio.run(go())


def _two_replicas(nodes: int, scrapes: int, run: int, tmp: Path) -> float | None:
    """Samples/s per replica of two ``fabricd server`` replicas (replica.enabled) on one PostgreSQL
    and NATS, from the first publish until every point is stored and both have written their
    latest values; None when this fabricd has no replicas."""
    import bus

    from fabricd.bus import BusNames
    from fabricd.wire import encode

    try:
        from fabricd.settings import ReplicaSettings  # noqa: F401 (the replicas' settings: issue 18 part 2)
    except ImportError:
        return None
    batches = fleet_batches(nodes, scrapes, t0=time.time() - 10.0 * scrapes)
    bodies = [encode(b) for b in batches]
    total = nodes * scrapes * PORTS_PER_NODE * COUNTERS_PER_PORT
    url, cleanup = _postgres_db(run, tmp)
    stream = bus.prefix()
    env = {"FABRICD_BUS__URL": bus.NATS_URL, "FABRICD_BUS__PREFIX": stream, "FABRICD_REPLICA__ENABLED": "true"}
    centrals: list[Central] = []
    try:
        for k in range(2):
            centrals.append(Central(tmp / f"replica-{run}-{k}", url, {**env, "FABRICD_REPLICA__ID": f"bench-{k}"}))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _claimed(centrals[0].url, BusNames(stream).partitions):
            time.sleep(0.2)
        start = time.perf_counter()
        bus.publish_all(stream, batches, bodies)
        while _points_in(url) < total:
            if time.perf_counter() - start > 600:
                raise RuntimeError("two replicas did not store every point in 600 s")
            time.sleep(0.05)
        for c in centrals:
            while _unflushed(c.url):
                time.sleep(0.05)
        rate = total / (time.perf_counter() - start) / 2
        _check_points(url, total)
        return rate
    finally:
        for c in centrals:
            c.close()
        bus.delete_stream(stream)
        cleanup()


def _unflushed(url: str) -> int:
    """Series whose latest value this replica holds in memory only; 0 where its status does not say."""
    got = httpx.get(f"{url}/api/v1/status", timeout=60)
    if got.status_code != 200:
        print(f"bench: {url}/api/v1/status answered {got.status_code}: {got.text[:200]}", file=sys.stderr)
        return 0
    return int(got.json()["latest_unflushed_series"])


def _claimed(url: str, partitions: int) -> bool:
    """Every partition held by a replica, and a correlator elected."""
    got = httpx.get(f"{url}/api/v1/replicas", timeout=10).json()
    return len(got.get("partitions", {})) == partitions and got.get("correlator") is not None


def bench_replica(mode: str) -> list[Row]:
    """Per-stage CPU of one replica, on SQLite and PostgreSQL; the bus alone and a central behind it."""
    import bus
    import pipeline

    nodes, scrapes, runs = {"smoke": (10, 2, 1), "quick": (100, 3, 2), "full": (500, 3, 3)}[mode]
    # In-process, enough scrapes for the steady state to weigh: the first of each node creates its
    # series (and detection learns them), a cost a running fleet no longer pays.
    steady = {"smoke": 3, "quick": 6, "full": 10}[mode]
    rows: list[Row] = []
    note = f"{nodes} nodes x 8 ports x 57 real IB counters x {steady} scrapes (the first creating the series), in-process, thread CPU"
    with tempfile.TemporaryDirectory() as tmp:
        rows += _stage_rows("SQLite", pipeline.run_on(_sqlite_db, nodes, steady, runs, Path(tmp)), note)
        if (probe := _postgres_url(999)) is not None:
            _drop_postgres(probe)
            rows += _stage_rows("PostgreSQL", pipeline.run_on(_postgres_db, nodes, steady, runs, Path(tmp)), note)
        if not bus.reachable():
            print("bench: NATS at 127.0.0.1:4222 unavailable; skipping the bus rows", file=sys.stderr)
            return rows
        return rows + _bus_rows(nodes, scrapes, runs, Path(tmp))


def _bus_rows(nodes: int, scrapes: int, runs: int, tmp: Path) -> list[Row]:
    """The bus alone, one replica behind it, and two replicas: end to end, wall clock."""
    import bus

    results = [_via_bus(nodes, scrapes, run, tmp, "PostgreSQL") for run in range(runs + 1)][1:]
    pairs = [_two_replicas(nodes, scrapes, run, tmp) for run in range(runs + 1)][1:]
    bus_note = f"{nodes * scrapes} batches of 480 samples, {bus.WINDOW} publishes in flight, one pull consumer"
    rows = [
        _row(
            "bus",
            "NATS JetStream publish, nats-py",
            Stat.of([r["bare_publish"] for r in results]),
            "samples/s",
            bus_note,
        ),
        _row(
            "bus",
            "NATS JetStream consume + ack, nats-py",
            Stat.of([r["bare_consume"] for r in results]),
            "samples/s",
            bus_note,
        ),
        _row(
            "bus",
            "NATS JetStream end to end, nats-py",
            Stat.of([r["bare_bus"] for r in results]),
            "samples/s",
            "publish then consume: the baseline",
        ),
        _row(
            "bus",
            "central ingest via NATS, PostgreSQL",
            Stat.of([r["central"] for r in results]),
            "samples/s",
            "one replica consuming the stream, until stored, detected and latest values written",
        ),
        _row(
            "bus",
            "ratio central via NATS / the bus alone",
            Stat.of([r["central"] / r["bare_bus"] for r in results]),
            "x",
            "pair by pair",
        ),
    ]
    if all(p is not None for p in pairs):
        per = [float(p) for p in pairs if p is not None]
        rows.append(
            _row(
                "bus",
                "two replicas via NATS, PostgreSQL, per replica",
                Stat.of(per),
                "samples/s",
                "replica.enabled x 2 on this machine, NATS and PostgreSQL beside them; until every point is "
                "stored, and latest values written where the replicas' status says (detection: the correlator's)",
            )
        )
        rows.append(
            _row(
                "bus",
                "ratio two replicas (sum) / the bus alone",
                Stat.of([2 * p / r["bare_bus"] for p, r in zip(per, results, strict=True)]),
                "x",
                "pair by pair",
            )
        )
    return rows


# --------------------------------------------------------------------------- report

SECTIONS: dict[str, Callable[[str], list[Row]]] = {
    "scrape": bench_scrape,
    "exposition": lambda mode: (
        bench_exposition(mode, PY, write_node_tree, NodeExporter, fabricd_per_scrape, _row)
        + bench_central_page(mode, _row)
    ),
    "footprint": bench_footprint,
    "ingest": bench_ingest,
    "transport": bench_transport,
    "detect": bench_detect,
    "replica": bench_replica,
}


def _row(section: str, what: str, stat: Stat, unit: str, note: str) -> Row:
    return {"section": section, "what": what, "unit": unit, "note": note, **stat.as_dict()}


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1e3:.3f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:,.3g} {unit}".strip()


def table(rows: list[Row]) -> str:
    lines = ["| section | measurement | median | min | max | runs | note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['section']} | {r['what']} | {_fmt(r['median'], r['unit'])} | {_fmt(r['min'], r['unit'])} "
            f"| {_fmt(r['max'], r['unit'])} | {r['runs']} | {r['note']} |"
        )
    return "\n".join(lines)


def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "commit": commit.stdout.strip() or "unknown",
        "date": time.strftime("%Y-%m-%d"),
    }


def write_docs(
    rows: list[Row], info: dict[str, str], doc: Path = REPO / "docs" / "benchmarks.md", only: list[str] | None = None
) -> None:
    """The table after ``<!-- bench:start -->``, with the run's machine and commit. A run of some
    sections (``only``) replaces just their rows, and, of a section it measured besides
    (``replica`` measures ``bus`` rows, ``ingest`` an ``exporter`` row), the rows it measured again,
    in place, each tagged with its commit and date, and adds a line to the run note: every other
    row stays as its own run left it (``ingest`` once dropped the bounded 10,000-node ``exporter``
    row, which only ``exposition`` measures)."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n\n"
    head, marker, old = text.partition("<!-- bench:start -->")
    run = f"{info['date']}, commit `{info['commit']}`, {info['cpu']} ({info['cores']} cores), Python {info['python']}"
    if only is None or not marker:
        doc.write_text(f"{head}<!-- bench:start -->\nLatest run ({info['mode']}): {run}.\n\n{table(rows)}\n")
        return
    lines = old.strip("\n").split("\n")
    note = [line for line in lines if not line.startswith("|")]
    tagged = [{**r, "note": f"{r['note']} (`{info['commit']}`, {info['date']})".strip()} for r in rows]
    fresh = table(tagged).split("\n")
    header, by_section = fresh[:2], _rows_by_section(fresh[2:])
    again = {_key(row): row for section, rows in by_section.items() if section not in only for row in rows}
    merged: list[str] = []
    for line in (line for line in lines if line.startswith("| ") and not line.startswith("| section |")):
        section = _key(line)[0]
        if section in only:
            if section in by_section:  # the first old row of a section run again: its new rows here
                merged.extend(by_section.pop(section))
        elif section in by_section:  # measured besides: its rows measured again replace theirs
            merged.append(again.pop(_key(line), line))
        else:
            merged.append(line)
    merged.extend(row for section, rows in by_section.items() if section in only for row in rows)
    merged.extend(again.values())
    added = f"The {', '.join(only)} rows: `python bench/run.py --only {','.join(only)}` ({info['mode']}) on {run}."
    body = "\n".join(note).strip("\n") + "\n" + added + "\n\n" + "\n".join(header + merged) + "\n"
    doc.write_text(f"{head}<!-- bench:start -->\n{body}")


def _key(line: str) -> tuple[str, str]:
    """A table row's (section, measurement)."""
    cells = line.split("|")
    return cells[1].strip(), cells[2].strip()


def _rows_by_section(lines: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in lines:
        out.setdefault(line.split("|")[1].strip(), []).append(line)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="fewer runs and shorter windows")
    size.add_argument("--smoke", action="store_true", help="toy sizes, once: checks the harness (tests)")
    ap.add_argument("--only", help="comma-separated sections: " + ",".join(SECTIONS))
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    ap.add_argument("--compare", type=Path, help="an earlier bench-results JSON to compare medians against")
    ap.add_argument("--results", type=Path, default=REPO / "bench-results", help="folder for latest.json")
    ap.add_argument("--docs", type=Path, default=REPO / "docs" / "benchmarks.md", help="the Markdown file to update")
    args = ap.parse_args()
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    unknown = [name for name in (args.only.split(",") if args.only else []) if name not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)} (known: {', '.join(SECTIONS)})")
    chosen = args.only.split(",") if args.only else list(SECTIONS)
    rows: list[Row] = []
    from fabricd.progress import progress

    with progress("bench", total=len(chosen)) as step:
        for name in chosen:
            rows.extend(SECTIONS[name](mode))
            step(note=f"{name} done")
    info = {**machine(), "mode": mode}
    print(table(rows))
    out = args.results
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps({"machine": info, "rows": rows}, indent=2))
    if args.compare:
        old = {(r["section"], r["what"]): r for r in json.loads(args.compare.read_text())["rows"]}
        for r in rows:
            o = old.get((r["section"], r["what"]))
            if o and o["median"]:
                print(f"{r['what']}: {r['median'] / o['median']:.2f}x of previous", file=sys.stderr)
    if not args.no_docs:
        write_docs(rows, info, args.docs, chosen if args.only else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
