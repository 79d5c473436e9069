"""Run collectors concurrently, each bounded by a timeout, and report each one's health.

A collector that raises or hangs is reported (``success=False``, ``duration_seconds``, the error)
and the others keep running. A collector that overran is left to finish (a read hung in a thread cannot
be cancelled) and is not started twice: it is reported as failed until it returns.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fabricd import logs
from fabricd.collector import Collector, build
from fabricd.model import CollectorHealth, Reading

log = logging.getLogger("fabricd.agent")
T = TypeVar("T")


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


async def close_collectors(collectors: Iterable[Collector]) -> None:
    """Call each collector's optional ``close`` (sync or async)."""
    for collector in collectors:
        closer = getattr(collector, "close", None)
        if closer is not None:
            result = closer()
            if asyncio.iscoroutine(result):
                await result


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


class Worker(Protocol):
    """Where a collector's blocking reads run: ``WorkerThread`` in the agent, ``InlineWorker`` in replays."""

    async def run(self, fn: Callable[[], T]) -> T: ...

    def close(self) -> None: ...


class InlineWorker:
    """Runs the call on the event loop's own thread.

    For ``fabricd eval`` only: it replays hundreds of simulated nodes in one process on files in
    tmpfs, which never block, and a thread per node would cost more in GIL hand-offs and context
    switches than the reads themselves (``fabricd eval large`` spent a third of its time there).
    """

    def __init__(self, name: str) -> None:
        self.name = name

    async def run(self, fn: Callable[[], T]) -> T:
        return fn()

    def close(self) -> None:
        pass


# A job for a WorkerThread: the loop to answer on, its future, the caller's context, the call.
_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", contextvars.Context, Callable[[], Any]]


class WorkerThread:
    """One long-lived daemon thread for a collector's blocking reads, in place of ``asyncio.to_thread``.

    A sysfs read can block (hw_counters query the firmware), so it must not run on the event loop;
    but a collector scraped every second pays for the hop every second, and to_thread's executor
    future, work item and future chaining cost about as much as reading the counters
    (docs/counters.md, "Performance"). Here a call is one queue put and one loop wake-up. Calls
    run one at a time in order: a call stuck in the kernel delays the next, which the runner never
    starts anyway while the collector is still running. A daemon thread, so a read hung in the
    kernel does not keep the process from exiting; it stops on ``close()`` or when the worker is
    garbage collected. The call runs in a copy of the caller's context, as with to_thread.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[_Job | None] | None = None
        self._stop: weakref.finalize[Any, Any] | None = None

    async def run(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue().put((loop, future, contextvars.copy_context(), fn))
        return await future

    def close(self) -> None:
        """Let the thread finish its current call and exit; a later ``run`` starts a new one."""
        if self._stop is not None:
            self._stop()
        self._jobs = self._stop = None

    def _queue(self) -> queue.SimpleQueue[_Job | None]:
        if self._jobs is None:
            jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(jobs,), name=self.name, daemon=True).start()
            self._jobs, self._stop = jobs, weakref.finalize(self, jobs.put, None)
        return self._jobs


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while (job := jobs.get()) is not None:
        loop, future, context, fn = job
        job = None  # hold no reference to a finished call while waiting for the next
        try:
            result, error = context.run(fn), None
        except BaseException as exc:  # delivered to the awaiting coroutine, as an executor would
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(_settle, future, result, error)
        except RuntimeError:
            pass  # the loop closed while the call ran: nobody is waiting


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the awaiting coroutine was cancelled
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
