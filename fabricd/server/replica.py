"""One central replica among N on one PostgreSQL and one NATS (``replica.enabled``).

Every third of a lease the replica heartbeats its claims session (fabricd/server/claims.py), reads who
holds what, and

* releases partitions above its fair share (ceil(partitions / live replicas)), a replica that
  joins takes them: its consumer stops first (the batch being stored is finished), then the lock
  is freed, so a partition never has two writers;
* claims free partitions up to its share, and any partition seen free on two ticks running
  whatever its share (a replica limited by ``replica.partitions`` leaves none orphaned);
* consumes each partition it holds with that partition's durable JetStream consumer
  (``BusConsumer.run(partition)``): the stream keeps a batch until it is stored, so a partition
  taken over resumes where the dead owner's acknowledgements stopped;
* tries the correlator's lock; the replica holding it runs detection over every partition
  (``correlate``) and owns the incidents.

A failed heartbeat (the session is gone: the server may already have freed the locks) stops every
consumer and the correlator at once, before anyone else can claim their partitions a full lease
later; then the replica connects again and claims afresh. A replica killed -9 frees its locks with
its session: another claims its partitions on its next tick, within a third of a lease; one that
hangs loses its session after a lease without heartbeat (fabricd/server/claims.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import anyio.to_thread

from fabricd import logs
from fabricd.server.claims import Claims, Ownership

log = logging.getLogger("fabricd.server.replica")
Consume = Callable[[int], Coroutine[Any, Any, None]]  # consume one partition until cancelled


class Replica:
    def __init__(
        self,
        claims: Claims,
        partitions: int,
        allowed: Sequence[int],
        consume: Consume,
        correlate: Callable[[], Coroutine[Any, Any, None]],
        lease_seconds: float,
    ) -> None:
        self.claims, self.partitions, self.consume, self.correlate = claims, partitions, consume, correlate
        self.allowed = sorted(set(allowed)) if allowed else list(range(partitions))
        self.lease = lease_seconds
        self.mine: dict[int, asyncio.Task[None]] = {}
        self.leading: asyncio.Task[None] | None = None
        self.ownership = Ownership({}, None, [])  # as of the last tick
        self._free_before: set[int] = set()

    def owns(self, partition: int) -> bool:
        return partition in self.mine

    async def run(self) -> None:
        """Until cancelled: connect the claims session, tick every third of a lease (the server ends a
        session idle for a lease); start over on failure."""
        while True:
            try:
                await anyio.to_thread.run_sync(self.claims.connect)
                logs.event(log, logging.INFO, "replica claims session open", replica=self.claims.replica_id)
                while True:
                    await self.tick()
                    await asyncio.sleep(self.lease / 3)
            except asyncio.CancelledError:
                await self._stop_all()
                await anyio.to_thread.run_sync(self.claims.close)
                raise
            except Exception as exc:
                logs.event(log, logging.WARNING, "replica claims lost; stopping its partitions", error=repr(exc))
                await self._stop_all()
                await anyio.to_thread.run_sync(self.claims.close)
                await asyncio.sleep(1.0)

    async def tick(self) -> None:
        await anyio.to_thread.run_sync(self.claims.heartbeat)
        now = self.ownership = await anyio.to_thread.run_sync(self.claims.ownership)
        share = math.ceil(self.partitions / max(1, len(now.replicas)))
        while len(self.mine) > share and len(now.replicas) > 1:
            await self._release(max(self.mine))
        free = {p for p in self.allowed if p not in now.partitions and p not in self.mine}
        for p in sorted(free):
            if len(self.mine) < share or p in self._free_before:
                await self._claim(p)
        self._free_before = free - set(self.mine)
        if self.leading is None and await anyio.to_thread.run_sync(self.claims.try_lead):
            logs.event(log, logging.INFO, "elected correlator", replica=self.claims.replica_id)
            self.leading = asyncio.create_task(self.correlate(), name="correlator")
        self.ownership = await anyio.to_thread.run_sync(self.claims.ownership)

    async def _claim(self, p: int) -> None:
        if await anyio.to_thread.run_sync(self.claims.try_claim, p):
            logs.event(log, logging.INFO, "partition claimed", partition=p, replica=self.claims.replica_id)
            self.mine[p] = asyncio.create_task(self.consume(p), name=f"partition-{p}")

    async def _release(self, p: int) -> None:
        await _cancel(self.mine.pop(p))
        await anyio.to_thread.run_sync(self.claims.release, p)
        logs.event(log, logging.INFO, "partition released to rebalance", partition=p, replica=self.claims.replica_id)

    async def _stop_all(self) -> None:
        tasks = [*self.mine.values(), *([self.leading] if self.leading is not None else [])]
        self.mine, self.leading = {}, None
        for task in tasks:
            await _cancel(task)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception:
        log.exception("a replica task failed while stopping")
