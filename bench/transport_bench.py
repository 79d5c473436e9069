"""Benchmark (not a test): how fast the agent's transport pushes batches to a local central.

Starts a real ``fabricd server`` on SQLite in a temporary folder (or uses ``--central URL``), then
submits ``--batches`` batches of ``--samples`` samples through ``fabricd.transport.Transport``
exactly as the agent does (msgpack + gzip, live workers, spool on failure) and waits until every
batch is acknowledged. Prints one JSON object on stdout:

    agent:   batches/s and samples/s from the first submit to the last acknowledgement
    encode:  batches/s the agent can encode alone (its CPU ceiling, no network)
    central: samples/s stored in SQLite, counted in the database itself

    .venv/bin/python bench/transport_bench.py --batches 200 --samples 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import httpx
from prometheus_client import CollectorRegistry

from fabricd.model import Batch, Reading, Sample
from fabricd.settings import AgentSettings, SpoolSettings, TransportSettings
from fabricd.transport import Transport
from fabricd.wire import MSGPACK, encode

REPO = Path(__file__).resolve().parent.parent
COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_xmit_wait")


def scrape(ts: float, samples: int) -> list[Sample]:
    """``samples`` samples at ``ts``: 4 counters on as many ports as needed."""
    return [Sample(ts=ts, reading=_reading(i, ts), rate=1e9) for i in range(samples)]


def _reading(i: int, ts: float) -> Reading:
    device, port = f"mlx5_{i // 4 // 8}", str(i // 4 % 8 + 1)
    return Reading(source="infiniband", device=device, port=port, counter=COUNTERS[i % 4], value=i * ts, unit="bytes")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn_central(port: int, db: Path, folder: Path, log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabricd",
            "server",
            "--listen",
            f"127.0.0.1:{port}",
            "--db",
            f"sqlite:///{db}",
            "--data-dir",
            str(folder),
            "--no-auth",
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


def start_central(folder: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    port, db = free_port(), folder / "bench.sqlite"
    with open(folder / "central.log", "wb") as log:
        proc = _spawn_central(port, db, folder, log)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url, db
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"central did not start; see {folder / 'central.log'}")


def encode_rate(samples: int, n: int = 20) -> float:
    batch = Batch(node="bench", agent_version="bench", batch_id="x", samples=scrape(1.0, samples), instance="i", seq=1)
    start = time.perf_counter()
    for _ in range(n):
        encode(batch, MSGPACK, compress=True)
    return n / (time.perf_counter() - start)


async def push(url: str, data_dir: Path, batches: int, samples: int) -> dict[str, float]:
    settings = AgentSettings(
        node="bench-node",
        central=url,
        data_dir=data_dir,
        transport=TransportSettings(batch_max_samples=samples, batch_max_seconds=3600, timeout_seconds=30),
        spool=SpoolSettings(drain_batches_per_second=1000),
    )
    registry = CollectorRegistry()
    transport = Transport(settings, agent_version="bench", registry=registry)
    await transport.start()
    t0 = time.time()
    start = time.perf_counter()
    for i in range(batches):
        await transport.submit(scrape(t0 + i, samples), [])
    sent = 0.0
    while sent < batches:
        await asyncio.sleep(0.01)
        sent = registry.get_sample_value("fabricd_agent_batches_sent_total") or 0.0
    elapsed = time.perf_counter() - start
    spooled = registry.get_sample_value("fabricd_agent_batches_spooled_total") or 0.0
    await transport.close()
    return {
        "seconds": elapsed,
        "batches_per_second": batches / elapsed,
        "samples_per_second": batches * samples / elapsed,
        "spooled_batches": spooled,
    }


def stored_points(db: Path) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        # Raw points are chunks on SQLite, one row per batch (fabricd/server/store/chunks.py).
        return int(con.execute("SELECT coalesce(sum(count), 0) FROM point_chunks").fetchone()[0])
    finally:
        con.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--samples", type=int, default=1000, help="samples per batch")
    ap.add_argument("--central", help="use this running central instead of starting one")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fabricd-bench-") as tmp:
        folder = Path(tmp)
        proc, url, db = (None, args.central, None) if args.central else start_central(folder)
        try:
            agent = asyncio.run(push(url, folder / "agent", args.batches, args.samples))
            report: dict[str, object] = {
                "batches": args.batches,
                "samples_per_batch": args.samples,
                "central": url,
                "agent": agent,
                "encode": {"batches_per_second": encode_rate(args.samples)},
                "cpus": os.cpu_count(),
            }
            if db is not None:
                points = stored_points(db)
                report["central_sqlite"] = {"points_stored": points, "samples_per_second": points / agent["seconds"]}
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
