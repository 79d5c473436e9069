"""A simulated cluster in real time: what ``fabricd sim`` and ``fabricd demo`` run.

``start(scenario, out_dir, speed)`` lays out every node's files, then a background thread advances
the model every quarter interval, ``sim_step / speed`` wall seconds (scenario time moves ``speed``
times faster than the wall clock; counters and the agents' rates follow), rewrites the changed files, refreshes each
node's next NCCL-tests output, and serves the pingmesh responders of every probed pair on loopback.
``handle.stop()`` stops the thread and closes the sockets. ``handle.agent_config(node)`` is the
config to give ``fabricd agent --config`` for that node (with ``--sysfs-root handle.sysfs_root(node)``).
"""

from __future__ import annotations

import asyncio
import math
import selectors
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricd.progress import Step, quiet
from fabricd.sim import probes
from fabricd.sim.cluster import SimCluster, create
from fabricd.sim.scenario import Scenario, load


@dataclass
class LiveCluster:
    cluster: SimCluster
    speed: float
    ports: dict[tuple[str, str], int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    @property
    def nodes(self) -> list[str]:
        return self.cluster.nodes

    @property
    def scenario(self) -> Scenario:
        return self.cluster.scenario

    def sysfs_root(self, node: str) -> Path:
        return self.cluster.sysfs_root(node)

    def agent_config(self, node: str) -> dict[str, Any]:
        return {"collectors": self.cluster.collectors_config(node, self.ports, self.speed)}

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        try:
            with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(_OnTimeEpoll())) as runner:
                runner.run(self._main())
        except BaseException as exc:  # reported to the caller through .error; the thread just ends
            self.error = exc
            self._ready.set()

    async def _main(self) -> None:
        responders = await probes.start_responders(self.cluster.sim)
        self.ports = {key: port for key, (_, port) in responders.items()}
        self.cluster.write_nccl(0.0)
        self._ready.set()
        try:
            await self._tick_loop()
        finally:
            for transport, _ in responders.values():
                transport.close()

    async def _tick_loop(self) -> None:
        sc = self.cluster.scenario
        step = sc.sim_step / self.speed
        started = time.monotonic()
        k = 0
        while not self._stop.is_set() and (k + 1) * sc.sim_step <= sc.duration:
            wait = started + (k + 1) * step - time.monotonic()
            if wait > 0:
                await asyncio.sleep(min(wait, 0.2))  # short naps: stop() answers within 0.2 s
                continue
            k += 1
            self.cluster.advance_to(k * sc.sim_step)
            self.cluster.write_nccl(k * sc.sim_step)


class _OnTimeEpoll(selectors.EpollSelector):
    """epoll whose waits end on time. asyncio's rounds a timeout up to whole milliseconds (epoll_wait
    takes milliseconds): a reply the path model delays by 290 us (a congested path's queue) went out
    1.0-1.4 ms late whenever no other datagram woke the loop first, five times the model's queue.
    Rounded down instead, the loop wakes up to a millisecond early and polls without blocking for
    the rest: a spin of at most a millisecond per delayed reply. (select() waits in microseconds but
    refuses descriptors numbered 1024 or more, which a long-lived process holds.)"""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            timeout = math.floor(timeout * 1e3) * 1e-3 - 1e-9  # under it: the parent's ceil keeps it
        return super().select(timeout)


def start(
    scenario: str | Path | Scenario, out_dir: Path, speed: float = 1.0, nodes: int | None = None, step: Step = quiet
) -> LiveCluster:
    """Start a simulated cluster in real time; returns once its files and responders are ready."""
    if speed <= 0:
        raise ValueError("speed must be positive")
    if not isinstance(scenario, Scenario):
        scenario = load(scenario, **({"topology": {"nodes": nodes}} if nodes else {}))
    live = LiveCluster(create(scenario, Path(out_dir), time.time(), step), speed)
    live._thread = threading.Thread(target=live._run, name="fabricd-sim", daemon=True)
    live._thread.start()
    live._ready.wait(timeout=60)
    if live.error is not None:
        raise RuntimeError(f"simulator failed to start: {live.error}") from live.error
    return live
