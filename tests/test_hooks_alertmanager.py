"""Incidents pushed to the real Debian ``prometheus-alertmanager``: firing, re-pushed, then resolved.

Alertmanager routes to a local webhook receiver with ``send_resolved``, so the test sees exactly what
an on-call engineer's pager integration would: a firing notification, then a resolved one.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fabricd.hooks import HookDispatcher, parse_hooks
from fabricd.model import IncidentState, Severity
from tests.helpers import need_binary
from tests.test_hooks import BASE, Receiver, incident, receiver  # noqa: F401  (receiver is a fixture)

pytestmark = [pytest.mark.binaries]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def am_config(receiver_url: str) -> dict[str, Any]:
    return {
        "route": {
            "receiver": "pager",
            "group_by": ["incident_id"],
            "group_wait": "0s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "pager", "webhook_configs": [{"url": receiver_url, "send_resolved": True}]}],
    }


@pytest.fixture
def alertmanager(tmp_path: Path, receiver: Receiver) -> Iterator[str]:  # noqa: F811
    binary = need_binary("prometheus-alertmanager")
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump(am_config(receiver.url + "/pager")))
    port = free_port()
    cmd = [
        binary,
        f"--config.file={config}",
        f"--storage.path={tmp_path / 'am'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    with open(tmp_path / "am.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), 30, f"alertmanager not ready: {(tmp_path / 'am.log').read_text()[-2000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(check: Callable[[], Any], seconds: float, message: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    pytest.fail(message)


def our_alerts(url: str, incident_id: str) -> list[dict[str, Any]]:
    alerts = httpx.get(url + "/api/v2/alerts", timeout=5).json()
    return [a for a in alerts if a["labels"].get("incident_id") == incident_id]


def pager_statuses(receiver: Receiver) -> list[str]:  # noqa: F811
    return [d.json()["status"] for d in receiver.received("/pager")]


async def test_incident_fires_is_repushed_and_resolves_in_alertmanager(alertmanager: str, receiver: Receiver) -> None:  # noqa: F811
    cfg = {"kind": "alertmanager", "url": alertmanager, "repush_seconds": 0.3, "labels": {"cluster": "lab"}}
    d = HookDispatcher(parse_hooks([cfg]), base_url=BASE)
    await d.start()
    try:
        d.notify(incident(IncidentState.OPEN, Severity.CRITICAL), "42")
        await d.drain()
        [alert] = await asyncio.to_thread(wait_for, lambda: our_alerts(alertmanager, "42"), 10, "alert not in AM")
        assert alert["labels"] == {
            "alertname": "FabricdCongestion",
            "severity": "critical",
            "kind": "congestion",
            "element": "leaf-02~spine-01",
            "incident_id": "42",
            "source": "fabricd",
            "cluster": "lab",
        }
        assert alert["status"]["state"] == "active"
        assert alert["annotations"]["report"] == f"{BASE}/api/v1/incidents/42/report"
        assert alert["startsAt"].startswith("2023-11-14T22:13:20")
        await asyncio.to_thread(wait_for, lambda: "firing" in pager_statuses(receiver), 10, "AM did not page")

        # While open, fabricd keeps pushing, so Alertmanager's resolve_timeout never ends the alert.
        first = alert["updatedAt"]
        await asyncio.to_thread(
            wait_for,
            lambda: our_alerts(alertmanager, "42")[0]["updatedAt"] != first,
            10,
            "open alert was not re-pushed",
        )

        d.notify(incident(IncidentState.RESOLVED), "42")
        await d.drain()
        await asyncio.to_thread(wait_for, lambda: not our_alerts(alertmanager, "42"), 10, "alert still active")
        await asyncio.to_thread(wait_for, lambda: "resolved" in pager_statuses(receiver), 10, "no resolved page")
    finally:
        await d.stop()
    resolved = next(p.json() for p in receiver.received("/pager") if p.json()["status"] == "resolved")
    assert resolved["alerts"][0]["labels"]["incident_id"] == "42"
    assert resolved["alerts"][0]["endsAt"].startswith("2023-11-14T22:23:20")  # resolved_ts, event time
