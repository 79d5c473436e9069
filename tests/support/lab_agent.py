"""fabricd's agents on the netns lab, feeding the detection engine in real time (one process).

One agent per host namespace runs the pingmesh collector (probing every other host, sockets opened
inside the host's namespace) and the netlink collector for the host's lab interface; one agent runs
the netlink collector in the switch namespace for the switch ports. Each is a real
``fabricd.agent.Agent`` (collectors built from ``collectors.REGISTRY`` by ``build_collectors`` ->
``ScrapePipeline``) on a clock shared by the round, so every round's samples carry one event time, as
a fleet scraping on a common schedule would. The only side effect swapped is where the probe sockets
are opened (``PingmeshFactories.socket``); the sysfs root is a parameter, as the agent's setting is.

Where the switch's readings go. The engine localizes port counters through the HCA port they
belong to (``signals.py``: per (node, interface), HCA port -> its host link). A switch port faces
exactly one host, and the queue on its egress is the downlink half of that host's link, so
``SwitchPorts`` presents the switch port's readings as readings of the host's lab interface (the
lab's "HCA port"), labelled ``switch_port=<switch interface>`` so they never merge with the host's
own series and the evidence says where the queue is. The mapping is data (port -> host
interface), not a case in any detector.

Topology (``lab_topology``): one leaf switch (the bridge), each host one HCA port (its interface),
host links ``<host>/fl-<host>~lab-leaf``. Paths on a star are known: ``star_paths``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collectors import REGISTRY
from collectors.pingmesh import PingmeshCollector, PingmeshFactories
from fabricd.agent.agent import Agent
from fabricd.agent.runtime import CollectorRunner
from fabricd.collector import CollectorFactories, build_collectors
from fabricd.detect.rules import RuleError, RuleSet, load_rules, parse_condition
from fabricd.detect.signals import SIGNALS
from fabricd.model import CollectorHealth, Reading, Sample, labels_of
from fabricd.settings import AgentSettings
from fabricd.topology import HcaPort, Switch, Topology
from tests.support.lab import Lab

LAB_SWITCH = "lab-leaf"  # a dash: element ids without one read as nodes (fabricd.detect.localize)
# The agent's own default (its ``--sysfs-root``): the lab's collectors read netlink and sockets only.
DEFAULT_SYSFS_ROOT: Path = AgentSettings.model_fields["sysfs_root"].default
Batch = list[tuple[str, Sample]]


# Rule values that depend on the scrape interval, for the lab's 1 s scrapes (the shipped ones assume
# 10 s). probe_outage: 15 % of a 10 s scrape is a 1.5 s outage; of a 1 s scrape it is 3 probes in 20.
# A link that merely drops a fraction of its packets (an 8-packet FIFO at 95 % load, probes losing
# ~25 % on average) was measured losing up to 60-70 % of one pair's probes in a single 1 s scrape
# (few probes, and those of one in-process agent leave in bursts); an outage of a second or more
# loses (nearly) all of one scrape's probes.
LAB_CONDITIONS: dict[str, tuple[str, str]] = {"probe_outage": ("> 90%", "< 50%")}


def lab_rules(
    rules: RuleSet | None = None,
    conditions: Mapping[str, tuple[str, str]] = LAB_CONDITIONS,
) -> RuleSet:
    """The shipped rules (or ``rules``) with ``conditions`` (rule name -> condition, clear) applied."""
    base = rules if rules is not None else load_rules(signals=SIGNALS)
    unknown = sorted(set(conditions) - {r.name for r in base.rules})
    if unknown:
        raise RuleError("lab_rules", unknown[0], "no such rule")
    out = []
    for rule in base.rules:
        if rule.name in conditions:
            condition, clear = conditions[rule.name]
            rule = replace(
                rule,
                condition=parse_condition(condition, "lab_rules", f"{rule.name}.condition"),
                clear=parse_condition(clear, "lab_rules", f"{rule.name}.clear"),
                source="lab_rules",
            )
        out.append(rule)
    return RuleSet(out, base.lifecycle, dict(base.params))


def lab_topology(lab: Lab, switch: str = LAB_SWITCH) -> Topology:
    topo = Topology(link_layer="ethernet")
    topo.add_switch(Switch(switch))
    for host in lab.hosts:
        hca = HcaPort(f"{host}/{lab.host_iface(host)}", host, lab.host_iface(host))
        topo.add_hca_port(hca)
        topo.connect_host(hca.id, switch)
    return topo


def star_paths(topology: Topology) -> Callable[[str, str], list[str] | None]:
    """On a star every pair crosses exactly its two host links (a path oracle for the engine)."""
    link_of = {topology.hca_ports[link.a].node: link.id for link in topology.links.values() if link.kind == "host"}

    def path(src: str, dst: str) -> list[str] | None:
        if src not in link_of or dst not in link_of:
            return None
        return [link_of[src], link_of[dst]]

    return path


@dataclass(frozen=True, slots=True)
class SwitchPorts:
    """Switch interface -> (host, host interface) it is cabled to."""

    switch: str
    ports: Mapping[str, tuple[str, str]]

    @classmethod
    def of(cls, lab: Lab, switch: str = LAB_SWITCH) -> SwitchPorts:
        return cls(switch, {lab.switch_port(h): (h, lab.host_iface(h)) for h in lab.hosts})

    def remap(self, samples: Sequence[Sample]) -> Batch:
        """The switch agent's samples as (node, sample): a port's readings move to the host it faces."""
        out: Batch = []
        for s in samples:
            end = self.ports.get(s.reading.device)
            if end is None:
                out.append((self.switch, s))
                continue
            r = s.reading
            labels = labels_of({**dict(r.labels), "switch_port": r.device})
            moved = Reading(
                r.source,
                end[1],
                r.port,
                r.counter,
                r.value,
                r.unit,
                r.kind,
                labels,
                r.name,
                r.width,
                r.saturates,
                r.scale,
            )
            out.append((end[0], Sample(s.ts, moved, s.rate, s.status, s.since)))
        return out


@dataclass
class Captured:
    """The agents' sink: keeps the last scrape (the lab feeds the engine directly, no transport)."""

    samples: list[Sample] = field(default_factory=list)
    health: list[CollectorHealth] = field(default_factory=list)

    async def submit(self, samples: Sequence[Sample], health: Sequence[CollectorHealth]) -> None:
        self.samples, self.health = list(samples), list(health)


class RoundClock:
    """Event time for one scrape round: every agent of the round reads the same instant."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now


@dataclass
class _Node:
    name: str
    agent: Agent
    sink: Captured


class LabFleet:
    """Every lab agent; ``scrape`` runs one round and returns its (node, sample) batch."""

    def __init__(
        self,
        lab: Lab,
        *,
        probe_rate: float = 20.0,
        probe_timeout: float = 1.0,
        # Wall time a collector may take: a guard against hangs only (the lab's event time is its own
        # clock). 0.8 s tripped on a loaded CI machine, a netlink dump into a namespace taking longer.
        collector_timeout: float = 5.0,
        switch: str = LAB_SWITCH,
        sysfs_root: Path = DEFAULT_SYSFS_ROOT,
    ) -> None:
        self.lab = lab
        self.sysfs_root = sysfs_root
        self.clock = RoundClock()
        self.switch_ports = SwitchPorts.of(lab, switch)
        self.nodes = [self._host(h, probe_rate, probe_timeout, collector_timeout) for h in lab.hosts]
        switch_netlink: dict[str, dict[str, Any]] = {
            "netlink": {"netns": lab.switch_ns, "interfaces": sorted(self.switch_ports.ports)},
        }
        self.nodes.append(self._node(switch, switch_netlink, (), collector_timeout))

    def _host(self, host: str, rate: float, timeout: float, collector_timeout: float) -> _Node:
        lab = self.lab
        peers = [{"name": p, "address": lab.address(p), "rate_per_second": rate} for p in lab.hosts if p != host]
        configured: dict[str, dict[str, Any]] = {
            "pingmesh": {"peers": peers, "listen_address": lab.address(host), "timeout_seconds": timeout},
            "netlink": {"netns": lab.ns(host), "interfaces": [lab.host_iface(host)]},
        }
        sockets = PingmeshFactories(socket=lab.socket_factory(host))
        return self._node(host, configured, (sockets,), collector_timeout)

    def _node(
        self,
        name: str,
        configured: Mapping[str, Mapping[str, Any]],
        factories: Sequence[CollectorFactories],
        collector_timeout: float,
    ) -> _Node:
        collectors = build_collectors(
            configured, node=name, sysfs_root=self.sysfs_root, registry=REGISTRY, factories=factories
        )
        sink = Captured()
        agent = Agent(CollectorRunner(collectors, collector_timeout), sink, self.clock, 1.0)
        return _Node(name, agent, sink)

    def pingmesh(self) -> list[PingmeshCollector]:
        found = (n.agent.runner.collectors.get("pingmesh") for n in self.nodes)
        return [c for c in found if isinstance(c, PingmeshCollector)]

    async def start(self) -> None:
        """Every responder up before the first probe (a probe to a closed port would count as lost)."""
        for collector in self.pingmesh():
            await collector.start(probe=False)

    async def scrape(self) -> tuple[Batch, list[CollectorHealth]]:
        self.clock.now = time.time()
        await asyncio.gather(*(n.agent.scrape_once() for n in self.nodes))
        batch: Batch = []
        health: list[CollectorHealth] = []
        for n in self.nodes:
            if n.name == self.switch_ports.switch:
                batch.extend(self.switch_ports.remap(n.sink.samples))
            else:
                batch.extend((n.name, s) for s in n.sink.samples)
            health.extend(n.sink.health)
        return batch, health

    async def close(self) -> None:
        for n in self.nodes:
            await n.agent.runner.close()
