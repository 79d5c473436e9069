"""Every Grafana panel query, evaluated by a real Prometheus scraping a real fabricd fed by the simulator.

The whole production path runs: ``fabricd sim`` writes each simulated node's sysfs tree, ethtool
statistics, NCCL-tests stand-in and pingmesh responders; one ``fabricd agent`` per node reads them
through the real collectors and ships batches to ``fabricd server``; the Debian ``prometheus`` scrapes
the central's (bounded: fleet summaries) and the agents' ``/metrics`` (every node's series, node_exporter's
pattern) every second (with fabricd's alert rules loaded). Then
every PromQL expression of every dashboard panel, with its template variables set to "All" and to a
real value, must return data. A renamed metric or a broken query fails here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fabricd.catalogue import lookup
from tests.helpers import REPO, need_binary
from tests.test_catalogue import assert_catalogued

pytestmark = [pytest.mark.binaries, pytest.mark.slow]

DASHBOARDS = sorted((REPO / "grafana" / "dashboards").glob("*.json"))
NODES = 4
SCENARIO = {
    "name": "dashboards",
    "seed": 11,
    "duration": "2h",
    "interval": "1s",
    "topology": {"nodes": NODES, "hcas_per_node": 1, "nodes_per_leaf": 2, "spines": 1, "link_layer": "roce"},
    "workload": {
        "kind": "allreduce",
        "load": 0.6,
        "probe_peers": 3,
        "probe_rate": 10,
        "nccl_every": 5,
        "nccl_sizes": 3,
    },
    "faults": [
        {"kind": "congestion", "at": "leaf-01~spine-01", "start": "0s", "end": "2h", "severity": 0.6},
        {"kind": "pfc_storm", "at": "node-004/mlx5_0", "start": "0s", "end": "2h", "severity": 0.8},
    ],
}
# Data every dashboard needs before its queries can be judged (each appears within a few scrapes).
READY = (
    "fabricd_derived_ecn_marked_ratio",
    "fabricd_derived_rx_pause_ratio",
    "fabricd_pingmesh_rtt_p99_seconds",
    "fabricd_nccl_busbw_bytes_per_second",
    "fabricd_agent_spool_bytes",
    "fabricd_collector_success",
    "rate(fabricd_ingest_samples_total[1m])",
    "fabricd_derived_xmit_wait_lost_bytes_per_second",
    "fabricd_fleet_signal_max",
    "fabricd_agent_info",
)
VARIABLE = re.compile(r"\$(\w+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Procs:
    tmp: Path
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self, name: str, cmd: list[str]) -> None:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process below
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        log.close()
        self.procs.append((name, proc))

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{self.log(name)}")

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@dataclass
class Stack:
    prometheus: str
    central: str
    agents: list[str]
    procs: Procs

    def query(self, expr: str) -> list[dict[str, Any]]:
        resp = httpx.get(self.prometheus + "/api/v1/query", params={"query": expr}, timeout=10)
        body = resp.json()
        assert body["status"] == "success", f"{expr}: {body}"
        return list(body["data"]["result"])

    def eventually(self, run: Callable[[], list[dict[str, Any]]], tries: int = 30) -> list[dict[str, Any]]:
        """A query's result, asked again for up to 30 s while empty: with a 1 s scrape interval (and
        so a 1 s scrape timeout) a busy 2-core machine sometimes misses a scrape, and Prometheus then
        marks that target's series stale until the next one succeeds."""
        for _ in range(tries):
            result = run()
            if result:
                return result
            time.sleep(1)
        return []

    def query_range(self, expr: str, seconds: float = 60) -> list[dict[str, Any]]:
        end = time.time()
        params: dict[str, str | float] = {"query": expr, "start": end - seconds, "end": end, "step": "2"}
        body = httpx.get(self.prometheus + "/api/v1/query_range", params=params, timeout=10).json()
        assert body["status"] == "success", f"{expr}: {body}"
        return list(body["data"]["result"])


def wait_until(check: Callable[[], bool], seconds: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1)
    pytest.fail(f"timed out waiting: {what()}")


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _agent_config(sim: Path, node: str, tmp: Path) -> Path:
    """The simulator's config of ``node``'s agent, with its own probe responder as in production
    (on a free port: the simulator's path responders answer its peers' probes)."""
    config = yaml.safe_load((sim / "agents" / f"{node}.yaml").read_text())
    pingmesh = config.get("collectors", {}).get("pingmesh")
    if pingmesh is not None:
        pingmesh.update(respond=True, listen_address="127.0.0.1", listen_port=0)
    path = tmp / f"agent-{node}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _prometheus_config(central: str, agents: list[str]) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in sorted((REPO / "rules" / "prometheus").glob("*.yml"))],
        "scrape_configs": [
            {"job_name": "fabricd", "static_configs": [{"targets": [central]}]},
            {"job_name": "fabricd-agent", "static_configs": [{"targets": agents}]},
        ],
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = need_binary("prometheus")
    tmp = tmp_path_factory.mktemp("dashboards")
    procs = Procs(tmp)
    python = [sys.executable, "-m", "fabricd"]
    try:
        scenario = tmp / "scenario.yaml"
        scenario.write_text(yaml.safe_dump(SCENARIO))
        sim = tmp / "sim"
        procs.start("sim", [*python, "sim", str(scenario), "--out", str(sim)])
        central_port = free_port()
        central = f"127.0.0.1:{central_port}"
        procs.start("server", [*python, "server", "--listen", central, "--data-dir", str(tmp / "central"), "--no-auth"])
        nodes = [f"node-{i:03d}" for i in range(1, NODES + 1)]
        wait_until(lambda: all((sim / "agents" / f"{n}.yaml").exists() for n in nodes), 60, lambda: procs.log("sim"))
        wait_until(lambda: _ready(f"http://{central}/healthz"), 60, lambda: procs.log("server"))
        agents = []
        for node in nodes:
            listen = f"127.0.0.1:{free_port()}"
            agents.append(listen)
            procs.start(
                f"agent-{node}",
                [
                    *python,
                    "agent",
                    "--node",
                    node,
                    "--central",
                    f"http://{central}",
                    "--sysfs-root",
                    str(sim / "nodes" / node / "sys"),
                    "--interval",
                    "1",
                    "--data-dir",
                    str(tmp / node),
                    "--metrics-listen",
                    listen,
                    "--config",
                    str(_agent_config(sim, node, tmp)),
                ],
            )
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump(_prometheus_config(central, agents)))
        prom = f"127.0.0.1:{free_port()}"
        procs.start(
            "prometheus",
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address={prom}",
                "--log.level=warn",
            ],
        )
        wait_until(lambda: _ready(f"http://{prom}/-/ready"), 60, lambda: procs.log("prometheus"))
        s = Stack(f"http://{prom}", central, agents, procs)
        wait_until(lambda: _all_ready(s), 150, lambda: _missing(s))
        yield s
    finally:
        procs.stop()


def _all_ready(s: Stack) -> bool:
    s.procs.check_alive()
    return not _missing(s)


def _missing(s: Stack) -> str:
    missing = [expr for expr in READY if not s.query(expr)]
    if not missing:
        return ""
    targets = httpx.get(s.prometheus + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets if t["health"] != "up"]
    return f"no data yet for {missing}; unhealthy scrapes: {health}; agent log: {s.procs.log('agent-node-001')}"


def panel_targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            yield panel["title"], t


def variable_values(s: Stack, dashboard: dict[str, Any], chosen: dict[str, str]) -> dict[str, str]:
    """Evaluate each query variable (``label_values(selector, label)``) in order, like Grafana."""
    values = dict(chosen)
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        selector, label = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"]).groups()  # type: ignore[union-attr]
        query = f"group by ({label}) ({substitute(selector, values)})"
        series = s.eventually(partial(s.query, query))
        found = sorted(r["metric"][label] for r in series if label in r["metric"])
        assert found, f"{dashboard['title']}: variable ${var['name']} has no values"
        values.setdefault(var["name"], promql_regex_escape(found[0]))
    return values


def promql_regex_escape(value: str) -> str:
    """As Grafana escapes a variable value for ``=~``: regex metacharacters, doubled for a PromQL string."""
    return re.sub(r"([.*+?^${}()|\[\]\\])", r"\\\\\1", value)


def substitute(expr: str, values: dict[str, str]) -> str:
    return VARIABLE.sub(lambda m: values.get(m.group(1), m.group(0)), expr)


# Rates of counters that saturate (32-bit, clamped at all ones: DOMAIN.md): once a port's counter is
# pinned it has no rate, by design, and its panel is rightly empty. The simulated congestion fills
# port_xmit_wait within minutes of the stack starting, so on a slow machine the panel can be empty.
SATURATING = {"fabricd_infiniband_port_transmit_wait_ticks_per_second": "port_xmit_wait"}


def _saturated(stack: Stack, expr: str, values: dict[str, str]) -> bool:
    """An empty panel of a saturating counter's rate whose selected ports are saturated."""
    for metric, counter in SATURATING.items():
        if metric in expr:
            node, device = values.get("node", ".*"), values.get("device", ".*")
            query = (
                f'fabricd_saturated_since_timestamp_seconds{{counter="{counter}",node=~"{node}",device=~"{device}"}}'
            )
            return bool(stack.query(query))
    return False


def test_the_probe_loss_alert_leaves_out_peers_whose_responder_just_started(stack: Stack) -> None:
    """The loss alert's exclusion on real series: every agent began answering probes when the stack
    started, less than the 6 minutes ``peer:fabricd_pingmesh_responder_missed:6m`` looks back (this
    test runs first), so its start, read from its own ``/metrics``, names it as a peer, by the same
    name its probers give it; and the alert's expression then keeps none of the pairs the loss
    ratio has."""
    nodes = {f"node-{i:03d}" for i in range(1, NODES + 1)}

    def missed() -> list[dict[str, Any]]:
        found = stack.query("peer:fabricd_pingmesh_responder_missed:6m")
        return found if {r["metric"]["peer"] for r in found} == nodes else []

    found = stack.eventually(missed)
    assert found, stack.query("peer:fabricd_pingmesh_responder_missed:6m")
    assert all(set(r["metric"]) == {"__name__", "peer"} for r in found)
    pairs = stack.eventually(lambda: stack.query("node_peer:fabricd_pingmesh_loss:ratio5m"))
    probed = {r["metric"]["peer"] for r in pairs}
    assert probed and probed <= nodes
    kept = "node_peer:fabricd_pingmesh_loss:ratio5m unless on (peer) peer:fabricd_pingmesh_responder_missed:6m"
    assert stack.query(kept) == []


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_every_panel_query_returns_data(stack: Stack, path: Path) -> None:
    dashboard = json.loads(path.read_text())
    all_values = {v["name"]: ".*" for v in dashboard["templating"]["list"] if v["type"] == "query"}
    one_value = variable_values(stack, dashboard, {})
    empty = []
    for values in (all_values, one_value):
        for title, t in panel_targets(dashboard):
            expr = substitute(t["expr"], values)
            assert "$" not in expr, f"{title}: unsubstituted variable in {expr}"
            query = partial(stack.query if t.get("instant") else stack.query_range, expr)
            if not stack.eventually(query) and not _saturated(stack, expr, values):
                empty.append(f"{title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_central_and_agent_metrics_are_catalogued_and_promtool_clean(stack: Stack) -> None:
    promtool = need_binary("promtool")
    for target in (stack.central, *stack.agents[:1]):
        text = httpx.get(f"http://{target}/metrics", timeout=10).text
        seen = assert_catalogued(text)
        lint = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
        assert lint.returncode == 0, (lint.stdout + lint.stderr).decode()[:3000]
        assert seen, target
    # Per-node series come from the agents; the central's page is its bounded summaries only.
    agent = httpx.get(f"http://{stack.agents[0]}/metrics", timeout=10).text
    assert 'fabricd_derived_ecn_marked_ratio{device="mlx5_0",node="node-001",port="1"}' in agent
    central = httpx.get(f"http://{stack.central}/metrics", timeout=10).text
    with_node = {
        line.split("{", 1)[0] for line in central.splitlines() if not line.startswith("#") and 'node="' in line
    }
    assert with_node == {"fabricd_fleet_signal_max"}
    assert f'fabricd_fleet_nodes{{state="reporting"}} {float(NODES)}' in central.splitlines()


def test_alert_rules_load_and_evaluate_on_real_data(stack: Stack) -> None:
    def rules() -> list[dict[str, Any]]:
        groups = httpx.get(stack.prometheus + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        return [r for g in groups for r in g["rules"]]

    # A rule not evaluated yet reports health "unknown" (a group's first evaluation can lag on a
    # loaded machine); wait for every rule to have run, then require all of them to be healthy.
    evaluated = stack.eventually(lambda: [] if any(r["health"] == "unknown" for r in rules()) else rules(), tries=30)
    files = sorted((REPO / "rules" / "prometheus").glob("*.yml"))
    shipped = sum(len(g["rules"]) for f in files for g in yaml.safe_load(f.read_text())["groups"])
    assert len(evaluated) == shipped, [(r["name"], r["health"]) for r in rules() if r["health"] == "unknown"]
    assert all(r["health"] == "ok" for r in evaluated), [
        (r["name"], r.get("lastError")) for r in evaluated if r["health"] != "ok"
    ]


def test_a_dead_peer_stays_known_after_its_series_go_stale(stack: Stack) -> None:
    """The last test on the stack: it kills an agent, as a host dies. Prometheus marks the dead
    target's series stale at its first failed scrape, and ``peer:fabricd_pingmesh_responder_seen``,
    which reads its own last value, still names that peer in evaluations after, so the loss
    alert's exclusion of a dead peer's pairs holds past the 5-minute lookback."""
    nodes = {f"node-{i:03d}" for i in range(1, NODES + 1)}

    def seen() -> list[dict[str, Any]]:
        found = stack.query("peer:fabricd_pingmesh_responder_seen")
        return found if {r["metric"]["peer"] for r in found} == nodes else []

    assert all(set(r["metric"]) == {"__name__", "peer"} for r in stack.eventually(seen))
    dead = f"node-{NODES:03d}"
    proc = dict(stack.procs.procs)[f"agent-{dead}"]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(15)
    start = f'fabricd_pingmesh_responder_start_time_seconds{{node="{dead}"}}'
    assert stack.eventually(lambda: [] if stack.query(start) else [{"stale": True}])
    stale = time.time()
    after = f'timestamp(peer:fabricd_pingmesh_responder_seen{{peer="{dead}"}}) > {stale:.3f}'
    assert stack.eventually(lambda: stack.query(after)), stack.query("peer:fabricd_pingmesh_responder_seen")
    assert stack.eventually(seen)


def test_dashboard_metrics_are_catalogued() -> None:
    for path in DASHBOARDS:
        for title, t in panel_targets(json.loads(path.read_text())):
            for name in re.findall(r"(?<![:\w])fabricd_[a-z0-9_]*[a-z0-9](?![:\w(])", t["expr"]):
                spec = lookup(name)
                assert spec is not None and not spec.pattern, f"{path.name} / {title}: {name} not catalogued"


def test_committed_dashboards_match_the_generator(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "grafana" / "generate.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    names = {p.stem for p in DASHBOARDS}
    assert names == {"fabric-overview", "port-drilldown", "pingmesh", "nccl-tests", "agent-health"}
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        assert {v["name"] for v in d["templating"]["list"]} >= {"datasource", "node"}
    port = json.loads((REPO / "grafana" / "dashboards" / "port-drilldown.json").read_text())
    assert {v["name"] for v in port["templating"]["list"]} >= {"node", "device", "port"}
