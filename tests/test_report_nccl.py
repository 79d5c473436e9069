"""The report's NCCL section judges a node against its own hardware, as its agent does.

A healthy simulated fleet (the shipped ``clean`` scenario, cut to 2 minutes: 16 nodes with two
400 Gb/s RoCE ports each, NCCL-tests every scrape) is replayed through the collectors, stored and
served by a real ``fabricd server`` (tests/support/simstore.py). ``fabricd report`` without model
flags must use each node's stored sysfs ports and each run's job shape, say so, and find the healthy
nodes efficient; the agent's own ``nccl_efficiency`` (derived on the node from the same sysfs) is
the oracle for the number.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fabricd.cli import main
from fabricd.cli.oncall import ApiClient
from fabricd.perfmodel import GBIT, Fabric, predict
from fabricd.sim.scenario import load
from tests.support.server import ServerProcess
from tests.support.simstore import StoredFleet, stored_fleet

pytestmark = pytest.mark.slow

CLEAN = load("clean", duration="2m", delivery={"mode": "aligned"})  # aligned rounds: tests/support/simstore.py
LARGEST = 4 * 1024**3  # the simulator's largest NCCL-tests size (8 MiB x 8^3)


@dataclass
class Env:
    fleet: StoredFleet
    server: ServerProcess

    def report(self, out: Path, *flags: str) -> str:
        span = ["--since", repr(self.fleet.start_ts), "--until", repr(self.fleet.end_ts)]
        args = ["report", *span, "--out", str(out), "--server", self.server.url, "--token", self.fleet.read_token]
        assert main([*args, *flags]) == 0
        return (out / "report.html").read_text()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    fleet = stored_fleet(CLEAN, tmp_path_factory.mktemp("nccl"))
    server = ServerProcess(fleet.data_dir, db=fleet.db_url, extra=["--log-level", "warning"]).start()
    try:
        yield Env(fleet, server)
    finally:
        server.stop()


def model_sentence(html: str) -> str:
    found = re.findall(r"<p>Model: (.*?)</p>", html)
    assert len(found) == 1, found  # one model: the fleet is uniform
    return found[0]


def agent_efficiency(env: Env) -> float:
    """The agents' own nccl_efficiency at the largest size, over every node and run of the window."""
    client = ApiClient(env.server.url, env.fleet.read_token, 30.0)
    try:
        rows = client.call(
            "GET",
            "/api/v1/series",
            {"source": "derived", "counter": "nccl_efficiency", "since": env.fleet.start_ts, "until": env.fleet.end_ts},
        )
    finally:
        client.close()
    values = [p["value"] for r in rows if r["labels"] == {"size": str(LARGEST)} for p in r["points"]]
    assert len({r["node"] for r in rows}) == CLEAN.topology.nodes
    return statistics.median(values)


def test_a_healthy_node_is_efficient_against_its_own_hardware(env: Env, tmp_path: Path) -> None:
    html = env.report(tmp_path / "own")
    sentence = model_sentence(html)
    assert sentence == (
        "fabricd model (docs/model.md) for 2 × 400 Gb/s per node (from each node&#x27;s sysfs), jobs of 2 nodes "
        f"× 2 GPUs, ring, efficiency 0.9; runs of 16 nodes (node-001 … node-016). Efficiency = measured median ÷ "
        f"predicted; at the largest size: {sentence.rsplit(': ', 1)[1]}"
    )
    largest = float(sentence.rsplit(": ", 1)[1].rstrip("."))
    assert largest > 0.8
    assert largest == pytest.approx(agent_efficiency(env), abs=0.01)  # the report and the agent agree


def test_the_prediction_is_the_model_of_the_nodes_ports(env: Env, tmp_path: Path) -> None:
    from fabricd.report import ReportQuery, RestSource, build_report

    client = ApiClient(env.server.url, env.fleet.read_token, 30.0)
    try:
        query = ReportQuery(since=env.fleet.start_ts, until=env.fleet.end_ts)
        plot = build_report(RestSource(client), query, env.fleet.end_ts).plot("nccl-all_reduce")
    finally:
        client.close()
    own = Fabric(link_rate_bytes_per_second=400 * GBIT, hcas_per_node=2, gpus_per_node=2)
    assert plot.data["predicted"] == [
        predict("all_reduce", s, 2, own).busbw_bytes_per_second for s in plot.data["sizes"]
    ]
    assert plot.data["sizes"][-1] == LARGEST


def test_hardware_flags_replace_the_nodes_own(env: Env, tmp_path: Path) -> None:
    # Told the nodes have 8 x 400 Gb/s (the old default), the same healthy runs read as a quarter efficient.
    html = env.report(tmp_path / "flags", "--hcas-per-node", "8", "--gpus-per-node", "8")
    sentence = model_sentence(html)
    assert sentence.startswith(
        "fabricd model (docs/model.md) for 8 × 400 Gb/s per node (from the flags), jobs of 2 nodes × 8 GPUs"
    )
    assert float(sentence.rsplit(": ", 1)[1].rstrip(".")) < 0.4
