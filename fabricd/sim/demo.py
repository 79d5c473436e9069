"""``fabricd demo``: the central service and agents on one machine, on the embedded default (SQLite).

Two modes, both running the real ``fabricd server`` and ``fabricd agent`` processes:

* default: a simulated cluster (``fabricd.sim.live``) whose counters move, with a fault injected a
  minute or two in, one agent per simulated node;
* ``--fixture``: one agent reading the real sysfs tree captured in ``deploy/demo/sys``.

Ctrl-C (or ``--duration``) stops everything cleanly; a SIGKILLed demo takes its children with it
(``fabricd.sim.tether``), and a demo whose address is taken says so before it starts anything.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
FIXTURE_SYSFS = REPO / "deploy" / "demo" / "sys"


@dataclass
class DemoOptions:
    listen: str = "127.0.0.1:9470"
    data_dir: Path = Path("data/demo")
    fixture: bool = False
    scenario: str = "demo"
    nodes: int = 16
    interval_seconds: float = 5.0
    speed: float = 1.0
    duration_seconds: float | None = None


@dataclass
class Demo:
    options: DemoOptions
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    sim: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.options.listen}"

    def _spawn(self, name: str, args: Sequence[str]) -> None:
        log_path = self.options.data_dir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fabricd.sim.tether", str(os.getpid()), *args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append((name, proc))

    def start_server(self) -> None:
        self._spawn(
            "server",
            [
                "server",
                "--listen",
                self.options.listen,
                "--data-dir",
                str(self.options.data_dir / "central"),
                "--no-auth",
                "--metrics-fleet-view",  # a small site: every node's series on the central's /metrics too
            ],
        )
        wait_healthy(self.url, timeout_seconds=30.0, procs=self.procs)

    def log_tail(self, name: str, lines: int = 15) -> str:
        """The end of a child's log: the cause is shown where the user looks, not only in the file."""
        path = self.options.data_dir / "logs" / f"{name}.log"
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n".join(f"  {line}" for line in text)

    def start_agent(self, node: str, sysfs_root: Path, config: dict[str, Any] | None = None) -> None:
        args = [
            "agent",
            "--central",
            self.url,
            "--node",
            node,
            "--sysfs-root",
            str(sysfs_root),
            "--interval",
            str(self.options.interval_seconds),
            "--data-dir",
            str(self.options.data_dir / "agents" / node),
        ]
        if config:
            cfg = self.options.data_dir / "agents" / f"{node}.yaml"
            cfg.parent.mkdir(parents=True, exist_ok=True)
            cfg.write_text(yaml.safe_dump(config))
            args += ["--config", str(cfg)]
        self._spawn(f"agent-{node}", args)

    def stop(self) -> None:
        if self.sim is not None:
            self.sim.stop()
        for _, proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_healthy(url: str, timeout_seconds: float, procs: Sequence[tuple[str, subprocess.Popen[bytes]]] = ()) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        for name, proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with status {proc.returncode}; see its log")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}/healthz did not answer within {timeout_seconds:g}s")


def upload_topology(url: str, doc: dict[str, Any]) -> None:
    response = httpx.put(f"{url}/api/v1/topology", json=doc, timeout=30.0)
    if response.status_code != 200:
        raise RuntimeError(f"uploading the topology failed: {response.status_code} {response.text[:300]}")


def _start_fixture_cluster(demo: Demo) -> list[str]:
    demo.start_agent("demo-node-001", FIXTURE_SYSFS)
    return ["demo-node-001"]


def start_simulated_cluster(demo: Demo) -> list[str]:
    from fabricd.sim import live
    from fabricd.topology import to_doc

    opts = demo.options
    demo.sim = live.start(opts.scenario, opts.data_dir / "sim", speed=opts.speed, nodes=opts.nodes)
    # The central localizes on the topology it knows: hand it the simulated fabric's and its probe
    # routes, as a discovery job (ibnetdiscover or LLDP, and ibtracert or traceroute) would.
    cluster = demo.sim.cluster
    upload_topology(demo.url, to_doc(cluster.sim.fabric.topology, cluster.routes(), cluster.replies()))
    for node in demo.sim.nodes:
        demo.start_agent(node, demo.sim.sysfs_root(node), demo.sim.agent_config(node))
    return list(demo.sim.nodes)


def _faults(demo: Demo) -> str:
    """What will go wrong, where and when (in wall-clock time from now, at the demo's speed)."""
    if demo.sim is None:
        return "  no fault is injected: the captured tree is static\n"
    speed = demo.options.speed
    lines = [
        f"  fault        {f.kind} at {f.at}, from {_clock(f.start / speed)} to {_clock(f.end / speed)} "
        f"from now (severity {f.severity:g})"
        for f in demo.sim.scenario.faults
    ]
    return "\n".join(lines or ["  no fault is injected (a clean scenario)"]) + "\n"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def _banner(demo: Demo, nodes: list[str]) -> str:
    url = demo.url
    what = (
        "the captured sysfs tree in deploy/demo/sys"
        if demo.options.fixture
        else f"a simulated cluster of {len(nodes)} nodes (scenario '{demo.options.scenario}')"
    )
    return f"""
fabricd demo is running: central service + {len(nodes)} agent(s) reading {what}.
{_faults(demo)}
  metrics      curl {url}/metrics | grep ^fabricd_
  health       curl {url}/healthz
  API docs     {url}/docs
  nodes        curl {url}/api/v1/nodes
  incidents    .venv/bin/fabricd incidents --server {url}
  status       .venv/bin/fabricd status --server {url}
  logs         {demo.options.data_dir}/logs/

Press Ctrl-C to stop.
"""


def address_in_use(listen: str) -> str | None:
    """Why ``listen`` cannot be served (taken, or not an address here), or None when it is free."""
    from fabricd.settings import parse_listen

    try:
        host, port = parse_listen(listen)
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind((host, port))
    except ValueError as exc:
        return f"--listen {listen!r}: {exc}"
    except OSError as exc:
        return (
            f"{listen} is already in use (another fabricd demo or server?): stop it, or pick another "
            f"address with --listen ({exc.strerror})"
        )
    return None


def run(options: DemoOptions) -> int:
    if (problem := address_in_use(options.listen)) is not None:
        print(f"fabricd demo: {problem}", file=sys.stderr)
        return 1
    if options.data_dir.exists():
        shutil.rmtree(options.data_dir)  # a demo always starts from a clean slate
    options.data_dir.mkdir(parents=True)
    demo = Demo(options)
    stop = {"now": False}

    def _on_signal(signum: int, frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        demo.start_server()
        nodes = _start_fixture_cluster(demo) if options.fixture else start_simulated_cluster(demo)
        print(_banner(demo, nodes), flush=True)
        deadline = None if options.duration_seconds is None else time.monotonic() + options.duration_seconds
        while not stop["now"] and (deadline is None or time.monotonic() < deadline):
            if any(proc.poll() is not None for _, proc in demo.procs):
                dead = [n for n, p in demo.procs if p.poll() is not None]
                print(f"fabricd demo: {', '.join(dead)} exited; see {options.data_dir}/logs/", file=sys.stderr)
                return 1
            time.sleep(0.5)
    except RuntimeError as exc:
        tail = demo.log_tail("server")
        print(f"fabricd demo: {exc}" + (f"\nthe server's log ends with:\n{tail}" if tail else ""), file=sys.stderr)
        return 1
    finally:
        demo.stop()
        print("fabricd demo stopped.", flush=True)
    return 0
