"""A stored batch wakes the detection loop (fabricd/server/wakeup.py) from the thread that stored it."""

from __future__ import annotations

import asyncio
import threading

from fabricd.server.wakeup import Wakeup


async def test_a_set_from_a_worker_thread_ends_the_wait_before_its_timeout() -> None:
    wakeup = Wakeup()
    wakeup.bind()
    worker = threading.Thread(target=wakeup.set)
    worker.start()
    # the wait's own timeout is an hour: only the wakeup can end it within the guard's 30 s
    await asyncio.wait_for(wakeup.wait(3600.0), timeout=30.0)
    worker.join()


async def test_wakeups_during_a_step_coalesce_and_a_set_before_bind_is_ignored() -> None:
    wakeup = Wakeup()
    wakeup.set()  # the loop is not bound yet: nothing to wake, nothing raised
    wakeup.bind()
    for _ in range(5):
        wakeup.set()
    await asyncio.wait_for(wakeup.wait(3600.0), timeout=30.0)
    await asyncio.sleep(0)  # let every queued set() run: they set one event, already cleared
    woke = asyncio.create_task(wakeup.wait(3600.0))
    await asyncio.sleep(0.2)
    assert not woke.done()  # five wakeups were one
    wakeup.set()
    await asyncio.wait_for(woke, timeout=30.0)
