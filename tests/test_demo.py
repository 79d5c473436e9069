"""`make demo` as a new user runs it: metrics within 30 s, an incident within 3 minutes, clean Ctrl-C.

Runs the real `fabricd demo` (central service + one agent process per simulated node, SQLite) on
a free port. Slow by nature (the demo's fault starts 75 s in, in real time).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow


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
            "400",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    started = time.monotonic()
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

        def fault_incidents() -> list[dict[str, object]]:
            # The demo scenario congests leaf-02~spine-01; the central localizes without a path
            # oracle (it cannot know the switches' ECMP hash), so the element may be the leaf,
            # its uplink or a host link behind it. Symptoms elsewhere may open incidents too.
            found = httpx.get(f"{url}/api/v1/incidents", timeout=10).json()
            return [i for i in found if i["kind"] == "congestion" and "leaf-02" in str(i["element"])]

        _poll("a congestion incident at leaf-02", 180 - (time.monotonic() - started), fault_incidents)
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert 'fabricd_incidents_open{kind="congestion"' in metrics

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
