"""``make bench`` section ``exposition``: an agent's own ``/metrics`` scraped as Prometheus scrapes it.

Prometheus asks each target for ``/metrics`` over a kept-alive HTTP/1.1 connection with
``Accept-Encoding: gzip`` (its ``enable_compression`` default); both sides here are scraped that
way. A node_exporter scrape reads the counters and renders them; the agent reads them once per
interval and renders at each scrape, so one Prometheus scrape of a node costs the agent a
collection (``fabricd collect``, startup subtracted, as in the ``scrape`` section) plus serving
``/metrics`` (the CPU a running ``fabricd agent`` spends over N back-to-back scrapes, minus its
own CPU over as long a time without scrapes). The ratio is taken pair by pair within one run.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from measure import Stat, free_port, pid_cpu_seconds

GZIP = {"Accept-Encoding": "gzip"}  # what Prometheus sends


class Agent:
    """``fabricd agent`` on the bench tree, central down (it spools), serving ``/metrics``."""

    def __init__(self, py: str, root: Path, data: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        argv = [py, "-m", "fabricd", "agent", "--node", "bench", "--sysfs-root", str(root), "--interval", "1"]
        argv += ["--central", f"http://127.0.0.1:{free_port()}", "--data-dir", str(data)]
        argv += ["--metrics-listen", f"127.0.0.1:{self.port}"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = httpx.Client(headers=GZIP)
        # Until the steady state: rates exist and the series count held over three collections
        # (a counter's rate appears at its second reading; some collectors read on a slower cadence).
        counts: list[int] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                counts.append(self.series())
            except httpx.HTTPError:
                counts.append(-1)
            if len(counts) >= 7 and len(set(counts[-7:])) == 1 and counts[-1] > 0:
                return
            time.sleep(0.5)
        self.close()
        raise RuntimeError(f"fabricd agent's /metrics did not settle: series counts {counts[-7:]}")

    def series(self) -> int:
        text = self.client.get(self.url, timeout=10).text
        return sum(1 for line in text.splitlines() if line and not line.startswith("#"))

    def per_scrape(self, n: int) -> float:
        cpu0, t0 = pid_cpu_seconds(self.proc.pid), time.monotonic()
        for _ in range(n):
            self.client.get(self.url, timeout=10).raise_for_status()
        busy, wall = pid_cpu_seconds(self.proc.pid) - cpu0, time.monotonic() - t0
        cpu1 = pid_cpu_seconds(self.proc.pid)  # its collections and spooling, without scrapes
        time.sleep(wall)
        idle = pid_cpu_seconds(self.proc.pid) - cpu1
        return max(busy - idle, 0.0) / n

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(15)


def bench_exposition(mode: str, py: str, write_tree, node_exporter, collect_per_scrape, row) -> list:  # type: ignore[no-untyped-def]
    n, runs = {"smoke": (20, 1), "quick": (300, 5), "full": (1000, 5)}[mode]
    with tempfile.TemporaryDirectory() as tmp:
        root = write_tree(Path(tmp) / "sys")
        ne = node_exporter(root, headers=GZIP)
        agent = Agent(py, root, Path(tmp) / "data")
        try:
            series = agent.series()
            triples = []
            for _ in range(runs + 1):  # the first is the warm-up
                triples.append((agent.per_scrape(n), collect_per_scrape(root, n), ne.per_scrape(n)))
        finally:
            agent.close()
            ne.close()
    triples = triples[1:]
    serve, collect, nex = (Stat.of([t[i] for t in triples]) for i in range(3))
    total = Stat.of([t[0] + t[1] for t in triples])
    ratio = Stat.of([(t[0] + t[1]) / t[2] for t in triples if t[2] > 0])
    note = f"{n} scrapes per run, gzip, kept-alive connection"
    return [
        row("exposition", "fabricd agent /metrics over HTTP, CPU per scrape", serve, "s", f"{series} series; " + note),
        row("exposition", "fabricd collect, CPU per collection", collect, "s", "same run, startup subtracted"),
        row("exposition", "fabricd agent per Prometheus scrape (collect + /metrics)", total, "s", "sum, pair by pair"),
        row("exposition", "node_exporter (infiniband only) over HTTP, CPU per scrape", nex, "s", note),
        row("exposition", "ratio agent (collect + /metrics) / node_exporter", ratio, "x", "goal <= 0.5"),
    ]


def bench_central_page(mode: str, row) -> list:  # type: ignore[no-untyped-def]
    """The central's bounded /metrics (``fabricd.server.metrics.render``) for a fleet of N nodes,
    each with 20 derived series and two collectors, on SQLite: the summaries read every derived
    series and the inventory's grouped counts at each scrape."""
    from prometheus_client import CollectorRegistry

    from fabricd.model import Batch, CollectorHealth, Kind, Reading, Sample
    from fabricd.server import db
    from fabricd.server.fleet_summary import FleetSignals
    from fabricd.server.metrics import FleetCollector, FleetView, ServerMetrics, render
    from fabricd.server.store.storage import Storage

    nodes, runs = {"smoke": (20, 1), "quick": (1000, 3), "full": (10_000, 5)}[mode]
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        engine = db.make_engine(f"sqlite:///{Path(tmp) / 'fabricd.db'}")
        db.prepare(engine)
        store = Storage.open(engine)
        signals = FleetSignals()
        for n in range(nodes):
            node = f"node-{n:05d}"
            samples = [
                Sample(now, Reading("derived", f"mlx5_{d}", "1", sig, 0.001 * d, "ratio", Kind.GAUGE, (), sig))
                for d in range(10)
                for sig in ("ecn_marked_ratio", "xmit_wait_ratio")
            ]
            health = [
                CollectorHealth("infiniband", True, 0.004, now),
                CollectorHealth("ethtool", n % 7 != 0, 0.01, now),
            ]
            batch = Batch(node, "0.1.0", f"b{n}", samples, health, created_ts=now, instance="bench", seq=1)
            store.writer.ingest(batch, now, 1000)
            signals.observe(node, samples)
        registry = CollectorRegistry(auto_describe=False)
        ServerMetrics(registry)
        registry.register(FleetCollector(store.latest, store.inventory, store.incidents, FleetView(), signals))
        times, lines = [], 0
        for _ in range(runs + 1):  # the first is the warm-up
            start = time.perf_counter()
            text = render(registry)
            times.append(time.perf_counter() - start)
            lines = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
        engine.dispose()
    return [
        row(
            "exporter",
            f"central /metrics render (bounded), {nodes}-node fleet",
            Stat.of(times[1:]),
            "s",
            f"{lines} series; {nodes * 20} derived series summarised, inventory counts on SQLite; goal <= 100 ms",
        )
    ]
