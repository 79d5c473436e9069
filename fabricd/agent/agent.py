"""The agent loop: scrape on a fixed schedule, turn counters into rates, hand samples to the sink."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from fabricd import logs
from fabricd.agent.runtime import CollectorRunner
from fabricd.clock import Clock
from fabricd.model import CollectorHealth, Sample
from fabricd.pipeline import ScrapePipeline

log = logging.getLogger("fabricd.agent")


class Sink(Protocol):
    """Where samples go after the agent: the transport (batching, spool, sender)."""

    async def submit(self, samples: Sequence[Sample], health: Sequence[CollectorHealth]) -> None: ...


class Agent:
    def __init__(
        self,
        runner: CollectorRunner,
        sink: Sink,
        clock: Clock,
        interval_seconds: float,
        pipeline: ScrapePipeline | None = None,
    ) -> None:
        self.runner = runner
        self.sink = sink
        self.clock = clock
        self.interval_seconds = interval_seconds
        self.pipeline = pipeline if pipeline is not None else ScrapePipeline()
        self.scrapes = 0

    async def scrape_once(self) -> list[Sample]:
        ts = self.clock.time()
        result = await self.runner.scrape(ts)
        samples = self.pipeline.samples(ts, result.readings)
        await self.sink.submit(samples, result.health)
        self.scrapes += 1
        return samples

    async def run(self, stop: asyncio.Event) -> None:
        """Scrape every ``interval_seconds`` on a monotonic schedule (no drift) until ``stop``."""
        logs.event(
            log,
            logging.INFO,
            "agent started",
            interval_seconds=self.interval_seconds,
            collectors=",".join(self.runner.collectors),
        )
        next_tick = time.monotonic()
        while not stop.is_set():
            await self.scrape_once()
            next_tick += self.interval_seconds
            delay = next_tick - time.monotonic()
            if delay < 0:  # overran: skip missed ticks rather than bursting to catch up
                next_tick = time.monotonic()
                delay = 0
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation (cpython#86296),
            # which hung the agent's shutdown.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await stop.wait()
