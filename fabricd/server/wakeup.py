"""Wake the detection loop when a batch is stored, instead of letting it sleep out its interval.

Settlement evaluates a moment as soon as the last node's scrape for it is in (fabricd.detect.settle);
a loop that only polls every ``detection_interval_seconds`` adds up to that much to every incident.
Batches are stored in worker threads, so ``set`` hands the wakeup to the event loop thread-safely.
Wakeups that come while a step runs coalesce into one; ``WAKE_FLOOR_SECONDS`` bounds the rate at
which a busy central re-evaluates (each step reads everything stored since the last one).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

WAKE_FLOOR_SECONDS = 0.1


class Wakeup:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._last = 0.0

    def bind(self) -> None:
        """Attach to the running event loop (the server's lifespan); ``set`` is a no-op before."""
        self._loop, self._event = asyncio.get_running_loop(), asyncio.Event()

    def set(self) -> None:
        """From any thread: something was stored."""
        loop, event = self._loop, self._event
        if loop is None or event is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            loop.call_soon_threadsafe(event.set)

    async def wait(self, timeout_seconds: float) -> None:
        """Until something is stored or ``timeout_seconds`` passed, and at least the floor since the
        last return."""
        event = self._event
        if event is None:
            await asyncio.sleep(timeout_seconds)
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_seconds):
                    await event.wait()
            event.clear()
        gap = WAKE_FLOOR_SECONDS - (time.monotonic() - self._last)
        if gap > 0:
            await asyncio.sleep(gap)
        self._last = time.monotonic()
