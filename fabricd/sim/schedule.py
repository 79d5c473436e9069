"""When each simulated node scrapes: its phase within the interval (``delivery: live``).

Agents start when they start, so their scrape schedules are spread over the interval; a replay
draws each node's phase from the scenario's seed so that runs are reproducible. The ground truth
uses the same phases to say when a node-local symptom first reaches the node's scrapes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from fabricd.sim.fabric import stable_hash
from fabricd.sim.scenario import Scenario


def phases(scenario: Scenario, nodes: Sequence[str], key: Callable[[str], str] = str) -> dict[str, float]:
    """Each node's scrape phase within the interval: seeded by ``key(node)`` (the node's default
    name, so ``topology.names`` only relabels), uniform (0 for aligned delivery)."""
    if not scenario.delivery.live:
        return dict.fromkeys(nodes, 0.0)
    seed = str(scenario.seed)
    return {n: random.Random(stable_hash(seed, "phase", key(n))).random() * scenario.interval for n in nodes}


def first_scrape(phase: float, interval: float, at: float) -> float:
    """The node's first scrape at or after scenario time ``at``."""
    return phase + math.ceil(max(0.0, at - phase) / interval - 1e-9) * interval
