"""The replay behind ``fabricd eval``: the production pipeline in event time, delivered as live.

Each simulated node runs the *same* collectors the agent runs (built by
``fabricd.collector.build_collectors``; only side effects are swapped through their typed
factories: the clocks, the NCCL-tests command runner, the probe sender and the read worker), the
agent's ``ScrapePipeline`` turns its readings into samples, and the central's detection path
(``fabricd.detect.feed.Detection``: settlement, then the engine) sees them as the central does.

Delivery is what a deployment does unless the scenario says ``delivery: {mode: aligned}``
(docs/simulator.md, "Delivery"): every node scrapes at its own phase of the interval (seeded), the
model moves every quarter interval, each batch arrives ``delay ± jitter`` seconds after its
scrape, late agents' batches later, silent agents' not at all until they come back and replay
their spool, and probe RTTs carry host jitter (``fabricd.sim.jitter``). The replay is a discrete
event loop: sim steps, scrapes and arrivals in time order; settlement is ticked at every event.
"""

from __future__ import annotations

import asyncio
import heapq
import random
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabricd import gctune
from fabricd.clock import ManualClock
from fabricd.collector import Collector, CollectorFactories
from fabricd.command import CommandResult
from fabricd.model import Incident, Reading, Sample
from fabricd.pipeline import ScrapePipeline
from fabricd.progress import Step, quiet
from fabricd.sim.cluster import SimCluster, create
from fabricd.sim.fabric import stable_hash
from fabricd.sim.probes import model_prober
from fabricd.sim.scenario import DeliverySpec, Scenario
from fabricd.sim.schedule import phases
from fabricd.sim.truth import Truth

EPOCH = 1_700_000_000.0  # event time of scenario time 0 in replays (fixed: runs are deterministic)
FD_RESERVE = 2048  # file descriptors left for everything but the collectors' open counter files
# event kinds, in the order they run when simultaneous: the model moves, then nodes scrape, then
# batches arrive (a batch is never delivered before its scrape)
STEP, SCRAPE, ARRIVE = 0, 1, 2


@dataclass
class Node:
    name: str
    collectors: dict[str, Collector]
    pipeline: ScrapePipeline


@dataclass
class Replay:
    truths: list[Truth]
    seen: dict[str, tuple[float, Incident]]  # first incident key -> (first report ts, last version)
    scrapes: int
    samples: int
    detect_seconds: float
    late_samples: int = 0


# --- the simulated nodes ------------------------------------------------------------------------


def _collector_options(cluster: SimCluster, node: str, fd_budget: int) -> dict[str, dict[str, Any]]:
    # The agent config `fabricd sim` prints; the probe ports are placeholders, since the pingmesh
    # collector gets a path-model prober (``_factories``) instead of a UDP socket.
    ports = {(p.src, p.dst): 7 for p in cluster.sim.fabric.probes if p.src == node}
    cfg = cluster.collectors_config(node, probe_ports=ports)
    cfg["infiniband"] = {"max_open_files": fd_budget}
    return cfg


class _ModelRunner:
    """The NCCL collector's command runner: prints what the stand-in command would print now."""

    def __init__(self, cluster: SimCluster, node: str, clock: ManualClock) -> None:
        self.cluster, self.node, self.clock = cluster, node, clock

    async def run(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult:
        del argv, timeout_seconds
        text = self.cluster.nccl_output(self.node, self.clock.now - self.cluster.epoch)
        return CommandResult(text, 0, duration_seconds=1.0)


def _factories(cluster: SimCluster, node: str, clock: ManualClock) -> tuple[CollectorFactories, ...]:
    """The simulated side effects of one node: event-time clocks, the stand-in NCCL runs, path-model
    probes, and reads of tmpfs inline (``fabricd.worker.InlineWorker``)."""
    from collectors.infiniband import InfinibandFactories
    from collectors.nccl import NcclFactories
    from collectors.pingmesh import PingmeshFactories
    from fabricd.worker import InlineWorker

    return (
        NcclFactories(runner=lambda: _ModelRunner(cluster, node, clock), monotonic=clock.time, wall_clock=clock.time),
        PingmeshFactories(
            prober=lambda targets, _timeout_ns: model_prober(cluster.sim, node, targets, lambda: int(clock.now * 1e9))
        ),
        InfinibandFactories(worker=InlineWorker),
    )


def build_nodes(cluster: SimCluster, clock: ManualClock) -> list[Node]:
    from collectors import REGISTRY
    from fabricd.collector import build_collectors

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    budget = max(0, min(1024, (soft - FD_RESERVE) // max(1, len(cluster.nodes))))
    nodes = []
    for name in cluster.nodes:
        collectors = build_collectors(
            _collector_options(cluster, name, budget),
            node=name,
            sysfs_root=cluster.sysfs_root(name),
            registry=REGISTRY,
            factories=_factories(cluster, name, clock),
        )
        nodes.append(Node(name, collectors, ScrapePipeline()))
    return nodes


async def scrape_node(node: Node, ts: float) -> list[Sample]:
    # In order and without the agent's runner: event time is the clock's, and a replay has no
    # hung reads to bound (every read is of tmpfs).
    readings: list[Reading] = []
    for collector in node.collectors.values():
        readings.extend(await collector.collect())
    return node.pipeline.samples(ts, readings)


async def close_nodes(nodes: list[Node]) -> None:
    from fabricd.collector import close_collectors

    for node in nodes:
        await close_collectors(node.collectors.values())


# --- delivery -----------------------------------------------------------------------------------


def arrival(delivery: DeliverySpec, node: str, ts: float, rng: random.Random) -> float | None:
    """When the batch of ``node``'s scrape at scenario time ``ts`` reaches the central (None: it
    is spooled by a silent agent and arrives when the silence ends)."""
    if not delivery.live:
        return ts
    at = ts + max(0.0, delivery.delay + rng.uniform(-delivery.jitter, delivery.jitter))
    for late in delivery.late:
        if late.node == node and late.start <= ts < late.end:
            if late.silent:
                return max(at, late.end) if late.end != float("inf") else None
            at += late.delay
    return at


# --- the replay ---------------------------------------------------------------------------------


async def replay(scenario: Scenario, workdir: Path, step: Step = quiet) -> Replay:
    """Run one scenario through the collectors, the rate engine, settlement and the engine."""
    # A replay allocates millions of short-lived readings and samples beside a large long-lived
    # state; with the default GC thresholds the collector took a third of ``eval large``.
    with gctune.raised():
        return await _replay(scenario, workdir, step)


async def _replay(scenario: Scenario, workdir: Path, step: Step) -> Replay:
    from fabricd.detect.engine import DetectionEngine
    from fabricd.detect.feed import Detection

    cluster = create(scenario, workdir, EPOCH)
    cluster.phases = phases(scenario, cluster.nodes, cluster.sim.fabric.key)
    clock = ManualClock(EPOCH)
    engine = DetectionEngine()
    engine.set_topology(cluster.sim.fabric.topology, cluster.routes())
    detection = Detection(engine)
    detection.expect(cluster.nodes, EPOCH)
    nodes = {n.name: n for n in build_nodes(cluster, clock)}
    run = _Run(cluster, detection, clock, scenario)
    try:
        await run.events(nodes, step)
        run.record(detection.flush(), clock.now)
    finally:
        await close_nodes(list(nodes.values()))
    return Replay(
        cluster.truths(), run.seen, run.scrapes, run.samples, run.detect_seconds, detection.settlement().late_samples
    )


class _Run:
    def __init__(self, cluster: SimCluster, detection: Any, clock: ManualClock, scenario: Scenario) -> None:
        self.cluster, self.detection, self.clock, self.scenario = cluster, detection, clock, scenario
        self.seen: dict[str, tuple[float, Incident]] = {}
        self.scrapes = self.samples = 0
        self.detect_seconds = 0.0
        self.rng = random.Random(stable_hash(str(scenario.seed), "delivery"))

    async def events(self, nodes: dict[str, Node], step: Step) -> None:
        sc = self.scenario
        queue: list[tuple[float, int, int, str, list[Sample]]] = []
        seq = 0
        k = 1
        while k * sc.sim_step <= sc.duration:
            queue.append((k * sc.sim_step, STEP, seq, "", []))
            seq += 1
            k += 1
        for name, phase in (self.cluster.phases or {}).items():
            j = 0
            while (t := phase + j * sc.interval) <= sc.duration:
                queue.append((t, SCRAPE, seq, name, []))
                seq += 1
                j += 1
        heapq.heapify(queue)
        last_note = -1.0
        while queue:
            t, kind, _, name, samples = heapq.heappop(queue)
            now = EPOCH + t
            if kind == STEP:
                self.cluster.sim.advance(t)
            elif kind == SCRAPE:
                got = await self._scrape(nodes[name], t)
                at = arrival(sc.delivery, name, t, self.rng)
                if at is not None:
                    heapq.heappush(queue, (at, ARRIVE, seq, name, got))
                    seq += 1
            else:
                started = time.perf_counter()
                self.detection.offer_scrape(name, samples, now)
                self.detect_seconds += time.perf_counter() - started
            if kind != SCRAPE:  # a scrape changes nothing the central has (its batch arrives later)
                self._tick(now)
            if t - last_note >= sc.interval:
                last_note = t
                step(note=f"{t:.0f}/{sc.duration:.0f} s simulated, {len(self.seen)} incident(s)")

    async def _scrape(self, node: Node, t: float) -> list[Sample]:
        cluster = self.cluster
        cluster.writers[node.name].write([cluster.sim.ports[p] for p in cluster.sim.fabric.ports_of[node.name]])
        self.clock.now = EPOCH + t
        samples = await scrape_node(node, self.clock.now)
        await asyncio.sleep(0)  # let a started NCCL run finish before the next scrape
        self.scrapes += 1
        self.samples += len(samples)
        return samples

    def _tick(self, now: float) -> None:
        started = time.perf_counter()
        changed = self.detection.tick(now)
        self.detect_seconds += time.perf_counter() - started
        self.record(changed, now)

    def record(self, changed: list[Incident], now: float) -> None:
        for inc in changed:
            origin = inc.narrowed_from[0] if inc.narrowed_from else inc.key  # narrowing keeps the incident
            first = self.seen[origin][0] if origin in self.seen else now  # when the central shows it
            self.seen[origin] = (first, inc)
