"""Host jitter on pingmesh RTTs, measured on this machine: what a loaded host adds to every probe.

fabricd's own prober and responder (``fabricd.probe``) in two processes on loopback, 4 peers per
prober at 10 probes/s each, summarized per ``--window`` seconds as the pingmesh collector does per
scrape (``Ledger.take_rtt``: min, p50, p90, p99, max), while ``--load`` processes spin on the
CPUs. Printed: per quantile, the median over windows and pairs (the host's level), the spread
between windows of one pair (robust sigma), and the spread of the common part of a prober's pairs.
These are the figures the simulator's ``delivery.host_jitter`` defaults and docs/detection.md cite.

    python bench/rtt_jitter.py [--seconds 60] [--window 5] [--load 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fabricd.probe import ProberProtocol, ResponderProtocol, Target, start_prober, start_responder

QUANTILES = ("min", "p50", "p90", "p99", "max")
PEERS = 4


def _spin(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def _responders(ports: list[int], stop_at: float) -> None:
    async def main() -> None:
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", port))
            await start_responder(sock, ResponderProtocol())
        await asyncio.sleep(max(0.0, stop_at - time.time()))

    asyncio.run(main())


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


async def _probe(ports: list[int], seconds: float, window: float) -> list[list[dict[str, float]]]:
    targets = [Target(f"peer{i}", "127.0.0.1", p, 10.0) for i, p in enumerate(ports)]
    proto = ProberProtocol(targets, timeout_ns=1_000_000_000)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    transport = await start_prober(sock, proto)
    windows: list[list[dict[str, float]]] = []
    await asyncio.sleep(window)  # warm-up window, dropped
    for ledger in proto.ledgers.values():
        ledger.take_rtt()
    for _ in range(int(seconds // window)):
        await asyncio.sleep(window)
        row = []
        for ledger in proto.ledgers.values():
            s = ledger.take_rtt()
            if s is not None:
                row.append({q: getattr(s, q) for q in QUANTILES})
        if len(row) == len(ports):
            windows.append(row)
    transport.close()
    return windows


def _sigma(values: list[float]) -> float:
    med = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - med) for v in values)


def summarize(windows: list[list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    out = {}
    for q in QUANTILES:
        level = statistics.median(r[q] for row in windows for r in row)
        pair = statistics.median(_sigma([row[i][q] for row in windows]) for i in range(PEERS))
        common = [min(r[q] for r in row) for row in windows]  # the prober's least-delayed pair
        residual = statistics.median(
            _sigma([row[i][q] - c for row, c in zip(windows, common, strict=True)]) for i in range(PEERS)
        )
        out[q] = {
            "level_us": round(level * 1e6, 1),
            "pair_sigma_us": round(pair * 1e6, 1),
            "common_sigma_us": round(_sigma(common) * 1e6, 1),
            "residual_sigma_us": round(residual * 1e6, 1),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--window", type=float, default=5.0, help="seconds per summary (the scrape interval)")
    ap.add_argument("--load", type=int, default=0, help="CPU-spinning processes beside the probes")
    args = ap.parse_args()
    stop_at = time.time() + args.seconds + 3 * args.window
    ports = _free_ports(PEERS)
    procs = [multiprocessing.Process(target=_responders, args=(ports, stop_at), daemon=True)]
    procs += [multiprocessing.Process(target=_spin, args=(stop_at,), daemon=True) for _ in range(args.load)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    windows = asyncio.run(_probe(ports, args.seconds, args.window))
    for p in procs:
        p.terminate()
    print(json.dumps({"load": args.load, "windows": len(windows), "rtt": summarize(windows)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
