"""``fabricd eval --live`` (issue 15): a shipped 16-node scenario run for real (simulator, server,
one agent process per node, in real time) opens the same incidents (kind, element) as the replay
of that scenario, and prints the replay's JSON keys plus ``"mode": "live"``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fabricd.sim import eval as ev
from fabricd.sim.scenario import load

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
DURATION_SECONDS = 240.0  # the demo's fault starts 75 s in: 2.75 minutes of it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clipped(name: str, duration: float) -> object:
    sc = load(name)
    faults = [dict(f.model_dump(), end=min(f.end, duration)) for f in sc.faults if f.start < duration]
    return load(name, duration=duration, faults=faults)


def test_a_live_run_opens_what_the_replay_opens(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fabricd",
            "eval",
            "--live",
            "demo",
            "--duration",
            "4m",
            "--json",
            "--listen",
            f"127.0.0.1:{_free_port()}",
            "--data-dir",
            str(tmp_path / "live"),
        ],
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    live = json.loads(out.stdout)
    replay = ev.report([ev.evaluate(_clipped("demo", DURATION_SECONDS))])  # type: ignore[arg-type]
    assert live["mode"] == "live"
    assert set(replay) | {"mode"} == set(live)
    opened = sorted((o["kind"], o["element"]) for o in live["scenarios"]["demo"]["opened"])
    expected = sorted((o["kind"], o["element"]) for o in replay["scenarios"]["demo"]["opened"])
    assert expected == [("congestion", "leaf-02~spine-01")]  # the replay itself is right
    assert opened == expected, live["scenarios"]["demo"]
    (fault,) = live["faults"]
    assert fault["detected"] and fault["correct"] and fault["on_time"], fault


def test_live_needs_exactly_one_scenario() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fabricd", "eval", "--live", "demo", "clean", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == "fabricd eval --live: give exactly one scenario (it runs in real time)"
