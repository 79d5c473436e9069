"""Run collectors concurrently, each bounded by a timeout, and report each one's health.

A collector that raises or hangs is reported (``success=False``, ``duration_seconds``, the error)
and the others keep running. A collector that overran is left to finish (a read hung in a thread cannot
be cancelled) and is not started twice: it is reported as failed until it returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricd import logs
from fabricd.collector import Collector, build
from fabricd.model import CollectorHealth, Reading

log = logging.getLogger("fabricd.agent")


@dataclass
class ScrapeResult:
    ts: float
    readings: list[Reading] = field(default_factory=list)
    health: list[CollectorHealth] = field(default_factory=list)


def build_collectors(
    configured: Mapping[str, Mapping[str, Any] | None],
    *,
    node: str,
    sysfs_root: Path,
    registry: Mapping[str, str],
    factories: Mapping[str, Any] | None = None,
) -> dict[str, Collector]:
    """Build every configured collector; raises CollectorConfigError naming the bad key."""
    return {
        name: build(name, opts, node=node, sysfs_root=sysfs_root, registry=registry, factories=factories)
        for name, opts in configured.items()
    }


class CollectorRunner:
    def __init__(self, collectors: Mapping[str, Collector], timeout_seconds: float) -> None:
        self.collectors = dict(collectors)
        self.timeout_seconds = timeout_seconds
        self._running: dict[str, asyncio.Task[Sequence[Reading]]] = {}

    async def scrape(self, ts: float) -> ScrapeResult:
        results = await asyncio.gather(*(self._run_one(n, c, ts) for n, c in self.collectors.items()))
        out = ScrapeResult(ts=ts)
        for readings, health in results:
            out.readings.extend(readings)
            out.health.append(health)
        return out

    async def _run_one(self, name: str, collector: Collector, ts: float) -> tuple[Sequence[Reading], CollectorHealth]:
        start = time.perf_counter()
        previous = self._running.get(name)
        if previous is not None and not previous.done():
            return (), self._failed(name, ts, start, "previous run still in progress")
        task = asyncio.ensure_future(collector.collect())
        self._running[name] = task
        try:
            readings = await asyncio.wait_for(asyncio.shield(task), self.timeout_seconds)
        except TimeoutError:
            # Not cancelled: a read blocked in a thread cannot be interrupted, and cancelling only the
            # awaiting coroutine would start a second thread next time. The late result is dropped.
            return (), self._failed(name, ts, start, f"timed out after {self.timeout_seconds:g}s")
        except Exception as exc:
            logs.event(log, logging.WARNING, "collector failed", collector=name, error=repr(exc))
            return (), self._failed(name, ts, start, f"{type(exc).__name__}: {exc}")
        duration = time.perf_counter() - start
        return readings, CollectorHealth(name, True, duration, ts, readings=len(readings))

    def _failed(self, name: str, ts: float, start: float, error: str) -> CollectorHealth:
        return CollectorHealth(name, False, time.perf_counter() - start, ts, error=error[:500])

    async def close(self) -> None:
        for task in self._running.values():
            task.cancel()
        for collector in self.collectors.values():
            closer = getattr(collector, "close", None)
            if closer is not None:
                result = closer()
                if asyncio.iscoroutine(result):
                    await result
