"""`make demo` as a new user runs it (issue 15): metrics within 30 s; within 3 minutes of the injected
fault exactly one incident, congestion on the faulty link; nothing else in the next 10 minutes;
clean Ctrl-C.

Runs the real `fabricd demo` (central service + one agent process per simulated node, SQLite) on
a free port, in real time: slow by nature (~15 minutes).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _poll(what: str, deadline_seconds: float, fn: object) -> object:
    assert callable(fn)
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        try:
            found = fn()
        except httpx.HTTPError:
            found = None
        if found:
            return found
        time.sleep(1.0)
    raise AssertionError(f"{what} did not happen within {deadline_seconds:g} s")


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _unexpected(url: str, right: tuple[str, str], fault: dict[str, object]) -> str:
    """Each incident other than ``right`` in full, as the API gives it, its times made relative to
    the fault's start."""
    start = float(fault["start_ts"])  # type: ignore[arg-type]
    listed = httpx.get(f"{url}/api/v1/incidents", params={"limit": 1000}, timeout=10).json()
    out = []
    for summary in listed:
        if (summary["kind"], summary["element"]) == right:
            continue
        full = httpx.get(f"{url}/api/v1/incidents/{summary['id']}", timeout=10).json()
        out.append(f"started {full['started_ts'] - start:+.1f} s after the fault: {json.dumps(full, indent=1)}")
    return "\n".join(out)


def test_demo_shows_metrics_then_an_incident_and_stops_cleanly(tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "demo.log").open("w")
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabricd",
            "demo",
            "--listen",
            f"127.0.0.1:{port}",
            "--data-dir",
            str(tmp_path / "demo"),
            "--duration",
            "1200",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    children: list[int] = []
    try:

        def port_counter() -> bool:
            text = httpx.get(f"{url}/metrics", timeout=10).text
            return any(
                line.startswith("fabricd_infiniband_port_") and 'node="node-' in line for line in text.splitlines()
            )

        _poll("a fabricd_ port counter on /metrics", 30, port_counter)
        assert httpx.get(f"{url}/healthz", timeout=5).json()["status"] == "ok"
        children = _children_of(demo.pid)
        assert len(children) >= 17, "central + one agent per simulated node"

        truth = json.loads((tmp_path / "demo" / "sim" / "truth.json").read_text())
        (fault,) = truth["faults"]
        assert (fault["kind"], fault["element"]) == ("congestion", "leaf-02~spine-01")

        right = ("congestion", "leaf-02~spine-01")

        def incidents() -> list[tuple[str, str]]:
            found = httpx.get(f"{url}/api/v1/incidents", params={"limit": 1000}, timeout=10).json()
            return sorted((i["kind"], i["element"]) for i in found)

        def only(allowed: list[list[tuple[str, str]]]) -> None:
            """Fails with every unexpected incident's evidence (its symptoms, candidates, timeline,
            seconds after the fault): a CI log is all a failed run leaves to diagnose it by."""
            now = incidents()
            if now not in allowed:
                raise AssertionError(f"incidents {now}, expected one of {allowed}:\n{_unexpected(url, right, fault)}")

        def wait_until(ts: float) -> None:
            while time.time() < ts:
                assert demo.poll() is None, (tmp_path / "demo.log").read_text()[-2000:]
                only([[], [right]])
                time.sleep(2.0)

        # Within 3 minutes of the fault: exactly one incident, on the faulty link ...
        wait_until(fault["start_ts"] + 180)
        only([[right]])
        # ... and no other incident in the following 10 minutes (wait_until checks all along).
        wait_until(fault["start_ts"] + 180 + 600)
        only([[right]])
        status = httpx.get(f"{url}/api/v1/status", timeout=10).json()
        settlement = status["settlement"]
        assert settlement["nodes"] == 16 and settlement["nodes_left_out"] == []
        assert settlement["settled_ts"] is not None and settlement["lag_seconds"] < 30
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert 'fabricd_incidents_open{kind="congestion"' in metrics
        assert "fabricd_detection_settled_timestamp_seconds " in metrics

        demo.send_signal(signal.SIGINT)  # what Ctrl-C does
        assert demo.wait(timeout=30) == 0
        time.sleep(0.5)
        alive = [
            pid
            for pid in children
            if Path(f"/proc/{pid}").exists() and "(Z" not in Path(f"/proc/{pid}/stat").read_text()
        ]
        assert alive == [], "every process the demo started is gone"
        assert "fabricd demo stopped." in (tmp_path / "demo.log").read_text()
    finally:
        if demo.poll() is None:  # the test failed midway: leave nothing running
            demo.kill()
            demo.wait()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        log.close()
