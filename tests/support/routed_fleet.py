"""Real fabricd processes on the routed lab (tests/support/routed_lab.py): one ``fabricd server`` in
the root namespace, listening on the lab's management network, and one ``fabricd agent`` per
namespace reporting to it over that network, as a cluster's agents reach their central over the
management network and never over the fabric they measure.

- a host's agent: pingmesh to every other host (its fabric address), netlink for ``eth0``, lldp;
- a switch's agent: lldp alone, as fabricd would run on a SONiC switch (SONiC ships lldpd). Not
  netlink: the detector reads port counters of HCA ports (a host's own), and a switch port's qdisc
  counters would stand for an element the topology does not have; the lab's faults must be found
  from the probes, which is what path tracing is there to sharpen.

Settings for a fast lab, each with its reason (docs/topology.md, "The routed lab"):

- scrape every ``INTERVAL_SECONDS`` = 2 s, not 10 s, so a fault opens within a short window;
- probes at ``PROBE_RATE`` = 10 per second per peer, the shipped default: 20 per pair per scrape;
- the one rule value that depends on the scrape interval, ``probe_outage`` (most of a scrape's
  probes lost: a 1.5 s outage is 15 % of a 10 s scrape), scaled to the same 1.5 s outage of a
  2 s scrape: 75 %;
- the central compares LLDP with the stored topology every 5 s (``topology_watch_seconds``);
- pingmesh re-traces every pair every ``TRACE_REFRESH_SECONDS`` = 20 s (shipped: 600 s), up to 5
  traces a second (shipped 1): a central restarted on an empty database (``LabCentral.fresh``)
  has every route again within seconds.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.helpers import REPO
from tests.support.routed_lab import RoutedLab
from tests.support.server import ServerProcess

INTERVAL_SECONDS = 2.0
PROBE_RATE = 10.0
OUTAGE_SECONDS = 1.5  # what probe_outage's shipped 15 % of a 10 s scrape stands for
SHIPPED_RULES = REPO / "rules" / "detection"
TRACE_REFRESH_SECONDS = 20.0
TRACE_RATE = 5.0


def lab_rules_dir(out: Path, interval_seconds: float = INTERVAL_SECONDS) -> Path:
    """The shipped detection rules with probe_outage scaled to ``interval_seconds`` (as files: the
    central reads its rules from ``rules_dir``)."""
    out.mkdir(parents=True, exist_ok=True)
    for path in SHIPPED_RULES.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        for rule in doc.get("rules") or []:
            if rule["name"] == "probe_outage":
                share = min(0.95, OUTAGE_SECONDS / interval_seconds)
                rule["condition"] = f"> {share:.0%}"
        (out / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


class LabCentral:
    """``fabricd server`` on the management network, without auth (the lab's network is its own)."""

    def __init__(self, data_dir: Path, rules_dir: Path, address: str) -> None:
        env = {
            "FABRICD_RULES_DIR": str(rules_dir),
            "FABRICD_TOPOLOGY_WATCH_SECONDS": "5",
        }
        self.server = ServerProcess(data_dir, auth=False, extra=["--log-level", "warning"], env=env, host="0.0.0.0")
        self.url = f"http://{address}:{self.server.port}"
        self.local = self.server.url

    def fresh(self) -> None:
        """Restart on an empty database (same address: the agents keep sending, spooling the few
        seconds it is away). What a fleet's start looks like to pingmesh (probes to hosts whose agent
        has not started yet are lost) is then not part of what the tests judge."""
        self.server.stop()
        for path in self.server.data_dir.glob("fabricd.db*"):
            path.unlink()
        self.server.start(timeout=120)  # a loaded machine: every agent drains its spool into it at once

    def get(self, path: str, **params: Any) -> Any:
        resp = httpx.get(f"{self.local}{path}", params=params, timeout=20)
        resp.raise_for_status()
        return resp.json()

    def put(self, path: str, body: Any) -> httpx.Response:
        return httpx.put(f"{self.local}{path}", json=body, timeout=20)


@contextlib.contextmanager
def lab_central(data_dir: Path, lab: RoutedLab) -> Iterator[LabCentral]:
    central = LabCentral(data_dir, lab_rules_dir(data_dir / "rules"), lab.mgmt_gateway)
    central.server.start()
    try:
        yield central
    finally:
        central.server.stop()


def agent_config(
    lab: RoutedLab, element: str, central: str, extra: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    lldp, chassis = lab.lldp_command(element)
    collectors: dict[str, dict[str, Any]] = {"lldp": {"command": lldp, "chassis_command": chassis}}
    if element in lab.wiring.hosts:
        peers = [
            {"name": p, "address": lab.address(p), "rate_per_second": PROBE_RATE}
            for p in lab.wiring.hosts
            if p != element
        ]
        collectors["pingmesh"] = {
            "peers": peers,
            "listen_address": lab.address(element),
            "trace_refresh_seconds": TRACE_REFRESH_SECONDS,
            "trace_rate_per_second": TRACE_RATE,
        }
        collectors["netlink"] = {"interfaces": ["eth0"]}
        for name, options in (extra or {}).items():
            collectors[name] = {**collectors.get(name, {}), **options}
    return {"node": element, "central": central, "interval_seconds": INTERVAL_SECONDS, "collectors": collectors}


def start_agents(
    lab: RoutedLab, central: LabCentral, data_dir: Path, extra: dict[str, dict[str, Any]] | None = None
) -> list[subprocess.Popen[bytes]]:
    """One ``fabricd agent`` in every namespace of the lab (``extra``: more options for the hosts'
    collectors, e.g. ``{"pingmesh": {"trace_paths": False}}``)."""
    started = []
    for element in lab.wiring.elements:
        home = data_dir / element
        home.mkdir(parents=True, exist_ok=True)
        (home / "agent.yaml").write_text(yaml.safe_dump(agent_config(lab, element, central.url, extra)))
        started.append(start_agent(lab, element, home))
    return started


def start_agent(lab: RoutedLab, element: str, home: Path) -> subprocess.Popen[bytes]:
    """``element``'s agent with the configuration in ``home`` (again, after a restart)."""
    config = home / "agent.yaml"
    argv: Sequence[str] = [sys.executable, "-m", "fabricd", "agent", "-c", str(config), "--data-dir", str(home)]
    return lab.spawn(element, argv, home / "agent.log", env={"PYTHONPATH": str(REPO)})


def stop_agents(agents: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in agents:
        proc.terminate()
    for proc in agents:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def wait_for(what: str, check: Any, seconds: float, every: float = 1.0) -> Any:
    """Poll ``check()`` until it returns something truthy; fail with ``what`` and the last value."""
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what} not within {seconds:g} s; last: {json.dumps(last, default=str)[:2000]}")
