"""A simulated cluster on disk: the model plus one folder of host files per node.

Used by ``fabricd sim`` / ``fabricd.sim.live`` (advanced on the wall clock) and by ``fabricd eval``
(advanced in event time). Folder layout::

    <out>/truth.json                  ground truth (never read by detectors)
    <out>/scenario.json               the scenario as run
    <out>/nodes/<node>/sys/...        sysfs tree (collector ``infiniband``, sysfs_root)
    <out>/nodes/<node>/ethtool/...    ethtool -S text (collector ``ethtool``, stats_dir; RoCE only)
    <out>/nodes/<node>/nccl/next.txt  output of the node's next NCCL-tests run (live mode)
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricd.progress import Step, quiet
from fabricd.sim import nccl as nccl_mod
from fabricd.sim.model import Simulation, simulate
from fabricd.sim.scenario import Scenario
from fabricd.sim.sysfstree import write_in_place
from fabricd.sim.truth import Truth, truths
from fabricd.sim.writers import NodeWriter, rate_text


@dataclass
class SimCluster:
    scenario: Scenario
    out: Path
    epoch: float  # event time of scenario time 0
    sim: Simulation
    writers: dict[str, NodeWriter] = field(default_factory=dict)
    phases: dict[str, float] | None = None  # the nodes' scrape phases, when this process sets them (replays)

    @property
    def nodes(self) -> list[str]:
        return self.sim.fabric.nodes

    def node_dir(self, node: str) -> Path:
        return self.out / "nodes" / node

    def sysfs_root(self, node: str) -> Path:
        return self.writers[node].sysfs_root

    def ethtool_dir(self, node: str) -> Path:
        return self.writers[node].ethtool_dir

    def nccl_file(self, node: str) -> Path:
        return self.node_dir(node) / "nccl" / "next.txt"

    def truths(self) -> list[Truth]:
        return truths(self.sim.fabric, self.epoch, self.phases)

    def routes(self) -> dict[tuple[str, str], list[str]]:
        """Where each probed pair's packets go (the switches' ECMP hash model): routing, not faults.
        What traceroute or ibtracert would tell the central about a real fabric."""
        fabric = self.sim.fabric
        out: dict[tuple[str, str], list[str]] = {}
        for p in fabric.probes:
            src, dst = fabric.rail_port(p.src, p.rail), fabric.rail_port(p.dst, p.rail)
            out[(p.src, p.dst)] = [p.src, p.dst, src, dst, *p.links]
        return out

    def replies(self) -> dict[tuple[str, str], list[str]]:
        """Where the replies to each probed pair's probes go, from dst back to src: the simulator
        routes them back over the request's links (symmetric; a fault on a link delays and drops
        both directions, ``model.probe_interval``)."""
        return {
            (src, dst): [dst, src, *reversed(path[2:4]), *reversed(path[4:])]
            for (src, dst), path in self.routes().items()
        }

    def write_all(self, step: Step = quiet) -> None:
        for node in self.nodes:
            ports = [self.sim.ports[p] for p in self.sim.fabric.ports_of[node]]
            self.writers[node].write(ports)
            step(note=node)

    def advance_to(self, t: float) -> None:
        """Scenario time ``t``: model step, then every node's files."""
        self.sim.advance(t)
        self.write_all()

    def nccl_output(self, node: str, t: float) -> str:
        return nccl_mod.run_output(self.sim, node, t)

    def write_nccl(self, t: float) -> None:
        """Live mode: the stand-in command prints this file (the run starting now)."""
        for node in self.nodes:
            path = self.nccl_file(node)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_in_place(path, self.nccl_output(node, t).encode())

    def write_truth(self) -> Path:
        path = self.out / "truth.json"
        doc = {
            "scenario": self.scenario.name,
            "epoch": self.epoch,
            "interval": self.scenario.interval,
            "faults": [t.to_json() for t in self.truths()],
        }
        path.write_text(json.dumps(doc, indent=2) + "\n")
        (self.out / "scenario.json").write_text(self.scenario.model_dump_json(indent=2) + "\n")
        return path

    def standin_command(self, node: str) -> list[str]:
        """The NCCL-tests stand-in: prints the node's current run in the real output format."""
        return [sys.executable, "-m", "fabricd.sim.standin", "all_reduce_perf", str(self.nccl_file(node))]

    def collectors_config(
        self, node: str, probe_ports: dict[tuple[str, str], int] | None = None, speed: float = 1.0
    ) -> dict[str, Any]:
        """The ``collectors:`` section of this node's agent config (intervals in wall seconds)."""
        cfg: dict[str, Any] = {"infiniband": {}}
        if self.scenario.topology.link_layer == "roce":
            cfg["ethtool"] = {"stats_dir": str(self.ethtool_dir(node))}
        if self.scenario.workload.nccl:
            cfg["nccl"] = {
                "command": self.standin_command(node),
                "interval_seconds": self.scenario.nccl_every / speed,
                "timeout_seconds": 60.0,
            }
        peers = [p for p in self.sim.fabric.probes if p.src == node]
        if peers and probe_ports is not None:
            cfg["pingmesh"] = {
                "respond": False,
                "peers": [
                    {
                        "name": p.dst,
                        "address": "127.0.0.1",
                        "port": probe_ports[(p.src, p.dst)],
                        "rate_per_second": self.scenario.workload.probe_rate,
                    }
                    for p in peers
                ],
            }
        return cfg


def create(scenario: Scenario, out: Path, epoch: float, step: Step = quiet) -> SimCluster:
    """Lay out every node's files at scenario time 0 and write the ground truth."""
    out.mkdir(parents=True, exist_ok=True)
    sim = simulate(scenario)
    rate = rate_text(scenario.topology.rate_gbps)
    cluster = SimCluster(scenario, out, epoch, sim)
    for node in sim.fabric.nodes:
        cluster.writers[node] = NodeWriter(cluster.node_dir(node), rate)
    cluster.write_all(step)
    cluster.write_truth()
    return cluster
