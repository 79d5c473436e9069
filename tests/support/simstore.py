"""A simulated fleet, replayed through the real pipeline into a real store, for CLI and report tests.

The scenario runs through the agent's collectors on the simulator's sysfs trees and commands
(``fabricd.sim.eval``'s replay pieces), every scrape is stored by the central's group-commit writer,
and the ``DetectionLoop`` runs the real detection engine over the stored stream, as the server does.
What a test then reads through ``fabricd server`` is what that server would show for the fleet.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabricd.model import Batch, Sample
from fabricd.server import db
from fabricd.server.app import create_app
from fabricd.settings import ServerSettings

Rounds = list[tuple[float, list[tuple[str, Sample]]]]


@dataclass
class StoredFleet:
    db_url: str
    data_dir: Path
    read_token: str
    admin_token: str
    start_ts: float  # event time of the first scrape
    end_ts: float  # event time of the last scrape
    cluster: Any  # fabricd.sim.cluster.SimCluster


async def replay(scenario: Any, workdir: Path) -> tuple[Any, Rounds]:
    """Every scrape of ``scenario``, as the agents' collectors read it from the simulator, in
    aligned rounds (the scenario should say ``delivery: {mode: aligned}``)."""
    from fabricd.clock import ManualClock
    from fabricd.sim import replay as ev
    from fabricd.sim.cluster import create

    cluster = create(scenario, workdir, ev.EPOCH)
    clock = ManualClock(ev.EPOCH)
    nodes = ev.build_nodes(cluster, clock)
    rounds: Rounds = []
    try:
        for k in range(int(scenario.duration // scenario.interval) + 1):
            cluster.advance_to(k * scenario.interval)
            clock.now = ev.EPOCH + k * scenario.interval
            rounds.append((clock.now, [(n.name, s) for n in nodes for s in await ev.scrape_node(n, clock.now)]))
            await asyncio.sleep(0)  # let started NCCL runs finish before the next scrape
    finally:
        await ev.close_nodes(nodes)
    return cluster, rounds


def store_and_detect(settings: ServerSettings, cluster: Any, rounds: Rounds) -> None:
    from fabricd.detect.engine import DetectionEngine
    from fabricd.server.detection import DetectionLoop, EngineFeed

    svc = create_app(settings).state.services
    db.prepare(svc.store.engine)
    for k, (ts, batch) in enumerate(rounds):
        per_node: dict[str, list[Sample]] = defaultdict(list)
        for node, s in batch:
            per_node[node].append(s)
        for node, samples in per_node.items():
            svc.store.writer.ingest(Batch(node, "sim", f"{node}-{k}", samples, created_ts=ts), ts, 20_000)
    engine = DetectionEngine()
    engine.set_topology(cluster.sim.fabric.topology, cluster.routes())
    feed = EngineFeed(engine)
    loop = DetectionLoop(svc.store.stream, svc.store.incidents, feed, svc.metrics, clock=lambda: rounds[-1][0])
    while loop.step():
        pass
    svc.store.engine.dispose()


def stored_fleet(scenario: Any, root: Path) -> StoredFleet:
    data = root / "data"
    db_url = f"sqlite:///{data / 'fabricd.db'}"
    settings = ServerSettings(db=db_url, data_dir=data, token_cache_seconds=0)
    cluster, rounds = asyncio.run(replay(scenario, root / "sim"))
    store_and_detect(settings, cluster, rounds)
    svc = create_app(settings).state.services
    read = svc.store.tokens.create("read", rounds[-1][0])[1]
    admin = svc.store.tokens.create("admin", rounds[-1][0])[1]
    svc.store.engine.dispose()
    return StoredFleet(db_url, data, read, admin, rounds[0][0], rounds[-1][0], cluster)
