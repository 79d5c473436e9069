"""Where a collector's blocking reads run: the ``Worker`` seam (one method, ``async run(fn)``).

A collector whose reads can block (sysfs ``hw_counters`` query the firmware) takes a ``Worker``
factory among its ``CollectorFactories``: ``WorkerThread`` in the agent, ``InlineWorker`` where
nothing blocks (``fabricd eval`` replaying hundreds of nodes from tmpfs).
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


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
