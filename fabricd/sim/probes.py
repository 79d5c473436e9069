"""Pingmesh against the path model: UDP responders for real time, a model prober for replays.

Real time (``fabricd sim``, the demo): one UDP responder per probed pair, bound on loopback. The
agent of ``src`` probes ``dst`` at the port of the (src, dst) responder, so the responder knows the
path and delays or drops each reply as the path model says *now* (probe packets are real; only the
network between the hosts is simulated).

Accelerated replay (``fabricd eval``): ``ModelProber`` has the shape of
``fabricd.probe.ProberProtocol`` as the pingmesh collector reads it (``targets``, ``ledgers`` with
``expire``/``counts``/``take_rtt``, ``clock_ns``, ``stop_sending``, ``drain``), filled from the model's
per-interval probe results instead of 10 datagrams per second and peer.
"""

from __future__ import annotations

import asyncio
import math
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from fabricd.probe import Probe, ResponderProtocol, Target, reply_to
from fabricd.probe_ledger import PeerCounts, RttSummary
from fabricd.sim import faults as faults_mod
from fabricd.sim.fabric import stable_hash
from fabricd.sim.jitter import host_level, jittered, pair_offset
from fabricd.sim.model import ProbeResult, Simulation, probe_interval


@dataclass
class ModelLedger:
    """Cumulative probe counts of one pair, as the model produced them up to the last advance;
    the RTTs of the model steps since the last scrape, with the hosts' jitter when the scenario's
    delivery is live (``fabricd.sim.jitter``)."""

    sim: Simulation
    key: tuple[str, str]
    taken_step: int = -1
    offset: float = 1.0  # the pair's fixed share of host cost

    def expire(self, now_ns: int) -> None:
        del now_ns  # the model's losses are final when the interval closes

    def counts(self) -> PeerCounts:
        sent, lost = self.sim.probe_totals.get(self.key, (0, 0))
        return PeerCounts(sent, sent - lost, lost, 0, 0, 0, 0)

    def take_rtt(self) -> RttSummary | None:
        steps = [r for i, r in self.sim.probe_log.get(self.key, ()) if i > self.taken_step and r.rtt is not None]
        self.taken_step = self.sim.step_index
        if not steps:
            return None
        count = sum(r.sent - r.lost for r in steps)
        rtts = [r.rtt for r in steps if r.rtt is not None]
        path = (
            min(r[0] for r in rtts),
            median(r[1] for r in rtts),
            median(r[2] for r in rtts),
            max(r[3] for r in rtts),
            max(r[4] for r in rtts),
        )
        delivery = self.sim.scenario.delivery
        if delivery.live:
            seed = str(self.sim.scenario.seed), str(self.sim.step_index)
            key = self.sim.fabric.key  # hash the default names: topology.names only relabels
            level = host_level(delivery.host_jitter, random.Random(stable_hash(*seed, "host", key(self.key[0]))))
            rng = random.Random(stable_hash(*seed, "jitter", *(key(k) for k in self.key)))
            path = jittered(path, count, delivery.host_jitter, self.offset, level, rng)
        return RttSummary(count, *path)


@dataclass
class ModelProber:
    sim: Simulation
    node: str
    targets: dict[int, Target] = field(default_factory=dict)
    ledgers: dict[int, ModelLedger] = field(default_factory=dict)
    clock_ns: Callable[[], int] = lambda: 0

    def stop_sending(self) -> None:
        return None

    def drain(self) -> None:
        return None  # nothing queued: the model's replies are in the ledgers already


def model_prober(sim: Simulation, node: str, targets: list[Target], clock_ns: Callable[[], int]) -> ModelProber:
    prober = ModelProber(sim, node, clock_ns=clock_ns)
    spec = sim.scenario.delivery.host_jitter
    for session, target in enumerate(targets):
        prober.targets[session] = target
        rng = random.Random(
            stable_hash(str(sim.scenario.seed), "pair", sim.fabric.key(node), sim.fabric.key(target.name))
        )
        prober.ledgers[session] = ModelLedger(sim, (node, target.name), offset=pair_offset(spec, rng))
    return prober


# --- real time ----------------------------------------------------------------------------------


class PathResponder(ResponderProtocol):
    """Answers probes of one (src, dst) pair after the path model's RTT, or drops them."""

    def __init__(self, sim: Simulation, pair_index: int, rng: random.Random) -> None:
        super().__init__()
        self.sim = sim
        self.pair = sim.fabric.probes[pair_index]
        self.rng = rng
        self.dropped = 0

    def respond(self, probe: Probe, addr: Any) -> None:
        result = self._now()
        if result.rtt is None or self.rng.random() < result.lost / max(1, result.sent):
            self.dropped += 1
            return
        delay = max(0.0, result.rtt[1] * math.exp(self.rng.gauss(0.0, 0.3)))
        asyncio.get_running_loop().call_later(delay, self.send, reply_to(probe), addr)

    def _now(self) -> ProbeResult:
        cond: faults_mod.Conditions = self.sim.last
        return probe_interval(self.pair, cond, 1.0, 100.0, self.rng, self.sim.fabric)


async def start_responders(sim: Simulation, host: str = "127.0.0.1") -> dict[tuple[str, str], tuple[Any, int]]:
    """One responder per probed pair on an ephemeral port: (src, dst) -> (transport, port)."""
    loop = asyncio.get_running_loop()
    out: dict[tuple[str, str], tuple[Any, int]] = {}
    for i, pair in enumerate(sim.fabric.probes):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((host, 0))
        sock.setblocking(False)
        rng = random.Random(sim.scenario.seed * 7919 + i)
        transport, _ = await loop.create_datagram_endpoint(lambda i=i, rng=rng: PathResponder(sim, i, rng), sock=sock)  # type: ignore[misc]
        out[(pair.src, pair.dst)] = (transport, sock.getsockname()[1])
    return out
