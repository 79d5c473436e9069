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
from typing import Any, TypeVar

from fabricd import logs
from fabricd.collector import Collector, close_collectors
from fabricd.model import CollectorHealth, Reading

log = logging.getLogger("fabricd.agent")
T = TypeVar("T")


@dataclass
class ScrapeResult:
    ts: float
    readings: list[Reading] = field(default_factory=list)
    health: list[CollectorHealth] = field(default_factory=list)


class CollectorRunner:
    def __init__(self, collectors: Mapping[str, Collector], timeout_seconds: float) -> None:
        self.collectors = dict(collectors)
        self.timeout_seconds = timeout_seconds
        self._running: dict[str, asyncio.Task[Sequence[Reading]]] = {}

    async def scrape(self, ts: float) -> ScrapeResult:
        runs = [self._run_one(n, c, ts) for n, c in self.collectors.items()]
        # gather() wraps each run in a task of its own: measurable per scrape, and useless for one.
        results = [await runs[0]] if len(runs) == 1 else await asyncio.gather(*runs)
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
            readings = await result_within(task, self.timeout_seconds)
        except TimeoutError:
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
        await close_collectors(self.collectors.values())


async def result_within(task: asyncio.Future[T], seconds: float) -> T:
    """The task's result, or TimeoutError after ``seconds``; the task is never cancelled.

    A read blocked in a thread cannot be interrupted, and cancelling only the awaiting coroutine
    would start a second thread next time: the runner keeps the task and drops its late result.
    (``asyncio.wait`` rather than ``wait_for(shield(task))``: one future and one loop turn fewer
    per scrape.)
    """
    try:
        await asyncio.wait((task,), timeout=seconds)
    finally:
        if not task.done():  # timed out, or the caller was cancelled: nobody will read the result
            task.add_done_callback(_drop_result)
    if not task.done():
        raise TimeoutError
    return task.result()


def _drop_result(task: asyncio.Future[Any]) -> None:
    # Retrieve a late exception so asyncio does not log "exception was never retrieved".
    if not task.cancelled():
        task.exception()
