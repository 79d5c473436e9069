"""``fabricd eval --live SCENARIO``: run the scenario for real and score what the server opened.

The same processes a user runs with ``fabricd demo``: the simulator in real time (``fabricd.sim.live``:
counter files, NCCL-tests stand-in, UDP responders), one ``fabricd server`` and one ``fabricd agent``
process per node. While it runs, the incidents list is polled every ``POLL_SECONDS``: an
incident's first report is when the API first showed it, which is what an on-call engineer sees.
At the end the incidents are scored against the ground truth with ``fabricd.sim.eval.score``,
the same function the replay is scored with.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fabricd.model import Incident, IncidentKind, IncidentState, Severity
from fabricd.sim import eval as ev
from fabricd.sim.demo import Demo, DemoOptions, address_in_use, start_simulated_cluster
from fabricd.sim.scenario import load

POLL_SECONDS = 0.5  # the resolution of 'first reported' (one cheap GET; 2 s made it 1 s late on average)
SETTLE_SECONDS = 15.0  # after the scenario's end: let the last batches settle and be evaluated


@dataclass(frozen=True)
class LiveOptions:
    scenario: str
    duration_seconds: float | None = None  # default: the scenario's own duration
    listen: str = "127.0.0.1:9471"
    data_dir: Path = Path("data/eval-live")


def evaluate_live(opts: LiveOptions) -> dict[str, Any]:
    """Run one scenario live and return the ``fabricd eval --json`` report with ``"mode": "live"``."""
    if (problem := address_in_use(opts.listen)) is not None:
        raise RuntimeError(problem)
    scenario = load(opts.scenario)
    duration = min(opts.duration_seconds or scenario.duration, scenario.duration)
    if opts.data_dir.exists():
        shutil.rmtree(opts.data_dir)
    opts.data_dir.mkdir(parents=True)
    demo = Demo(
        DemoOptions(
            listen=opts.listen,
            data_dir=opts.data_dir,
            scenario=opts.scenario,
            nodes=scenario.topology.nodes,
            interval_seconds=scenario.interval,
        )
    )
    started = time.perf_counter()
    try:
        demo.start_server()
        start_simulated_cluster(demo)
        seen = _watch(demo, demo.sim.cluster.epoch + duration + SETTLE_SECONDS)
        truths = demo.sim.cluster.truths()
    finally:
        demo.stop()
    clipped = [t for t in truths if t.start_ts < demo.sim.cluster.epoch + duration]
    result = ev.score(scenario.name, scenario.interval, clipped, seen)
    result.wall_seconds = time.perf_counter() - started
    report = ev.report([result])
    report["mode"] = "live"
    return report


def _watch(demo: Demo, until: float) -> dict[str, tuple[float, Incident]]:
    seen: dict[str, tuple[float, Incident]] = {}
    with httpx.Client(base_url=demo.url, timeout=10.0) as client:
        while time.time() < until:
            dead = [name for name, proc in demo.procs if proc.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited during the live run; see {demo.options.data_dir}/logs/")
            now = time.time()
            response = client.get("/api/v1/incidents", params={"limit": 1000})
            response.raise_for_status()
            for row in response.json():
                inc, origin = _incident(row), str(row["id"])  # the id stays when an incident is narrowed
                first = seen[origin][0] if origin in seen else now
                seen[origin] = (first, inc)
            time.sleep(POLL_SECONDS)
    return seen


def _incident(row: dict[str, Any]) -> Incident:
    return Incident(
        key=row["key"],
        kind=IncidentKind(row["kind"]),
        severity=Severity(row["severity"]),
        state=IncidentState(row["state"]),
        element=row["element"],
        summary=row["summary"],
        started_ts=row["started_ts"],
        updated_ts=row["updated_ts"],
        resolved_ts=row["resolved_ts"],
    )
