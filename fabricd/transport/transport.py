"""The agent's transport: batch, send live, spool while the central is away, drain the backlog.

    submit() -> Batcher -> live queue -> live workers --200--> done
                                            |  down / 5xx / 429 / timeout
                                            v
                                          Spool (disk) -> drain task (oldest first, rate-limited)

Live batches and the backlog flow on separate tasks, so neither starves the other: fresh data is
sent as soon as the central answers, and the backlog follows at ``spool.drain_batches_per_second``.
A spooled batch is deleted only after the central acknowledged it (200); a re-send after a lost
acknowledgement carries the same batch id, which the central answers with ``duplicate: true``
without storing it twice. Wire-version mismatches (rolling upgrades): ``versions.py``. Design
notes: docs/transport.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from fabricd import logs
from fabricd.clock import Clock, SystemClock
from fabricd.model import Batch, CollectorHealth, Sample
from fabricd.settings import AgentSettings, TransportSettings
from fabricd.transport.batcher import Batcher
from fabricd.transport.link import Grant, Link
from fabricd.transport.metrics import TransportMetrics
from fabricd.transport.sender import Backoff, Outcome, Poster, Sender, SendResult, default_poster_factory
from fabricd.transport.spool import (
    FLAG_GZIP,
    FLAG_JSON,
    CorruptSpoolFile,
    Entry,
    Spool,
    SpooledBatch,
    SpoolWriteError,
    pack,
)
from fabricd.transport.versions import Parked, ours_is_read, outage_message, park
from fabricd.wire import JSON, MSGPACK, encode

log = logging.getLogger("fabricd.transport")

# Live batches in memory waiting for a worker; past this, new batches go to the spool instead of
# making the agent loop wait (backpressure never stalls collection).
LIVE_QUEUE_MAX = 16
# Concurrent live sends: a slow answer does not hold the next batch back.
LIVE_WORKERS = 4

PosterFactory = Callable[[TransportSettings], Poster]


@dataclass(frozen=True, slots=True)
class Encoded:
    key: int  # creation order: the spool drains in this order
    batch_id: str
    body: bytes
    samples: int


class Transport:
    def __init__(
        self,
        settings: AgentSettings,
        *,
        agent_version: str,
        registry: CollectorRegistry | None = None,
        poster_factory: PosterFactory = default_poster_factory,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        cfg = settings.transport
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = TransportMetrics(self.registry)
        self.sent_batches = 0  # acknowledged by the central (or the bus), for the closing log line
        self.spool = Spool(settings.spool.dir or settings.data_dir / "spool", settings.spool.max_bytes)
        self._clock = clock or SystemClock()
        self.batcher = Batcher(
            settings.node, agent_version, cfg.batch_max_samples, cfg.batch_max_seconds, self._clock.time
        )
        self.wire_version = cfg.wire_version
        self._parked = Parked()  # old-version spooled batches the central no longer reads
        self.link = Link(Backoff(cfg.backoff_initial_seconds, cfg.backoff_max_seconds, rng))
        self.content_type = JSON if cfg.encoding == "json" else MSGPACK
        self._flags = (FLAG_GZIP if cfg.compress else 0) | (FLAG_JSON if cfg.encoding == "json" else 0)
        self._agent_version = agent_version
        self._poster_factory = poster_factory
        self._poster: Poster | None = None
        self._sender: Sender | None = None
        self._queue: asyncio.Queue[tuple[int, Batch]] = asyncio.Queue(LIVE_QUEUE_MAX)
        self._inflight: dict[str, tuple[int, Batch]] = {}  # dequeued, not yet settled
        self._opened = asyncio.Event()  # the batcher holds data: the timer has a deadline
        self._wake_drain = asyncio.Event()  # spool grew or the link came back
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self.spool.open)
        self._update_spool_gauges()
        self._poster = self._poster_factory(self.settings.transport)
        self._sender = Sender(
            self.settings.transport,
            self.settings.central,
            self.settings.token,
            self._agent_version,
            self._poster,
            self._clock.time,
        )
        self._tasks = [
            asyncio.create_task(self._timer(), name="transport-timer"),
            asyncio.create_task(self._drain(), name="transport-drain"),
        ]
        self._tasks += [
            asyncio.create_task(self._live_worker(), name=f"transport-live-{i}") for i in range(LIVE_WORKERS)
        ]
        logs.event(
            log,
            logging.INFO,
            "transport started",
            central=self._sender.url,
            wire_version=self.wire_version,
            instance=self.batcher.instance,
            spooled_batches=len(self.spool),
            spool_bytes=self.spool.size_bytes,
        )

    async def close(self) -> None:
        """Flush: send what is pending (bounded by the send timeout), spool whatever is left."""
        batch = self.batcher.flush()
        if batch is not None:
            await self._enqueue(batch)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.transport.timeout_seconds):
                await self._queue.join()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._spool_leftovers()
        closer = getattr(self._poster, "aclose", None)
        if closer is not None:
            await closer()
        # What this process delivered in all, final once it stops: what a restart or a test accounts for.
        logs.event(
            log, logging.INFO, "transport closed", spooled_batches=len(self.spool), sent_batches=self.sent_batches
        )

    async def _spool_leftovers(self) -> None:
        # Cancelled mid-send: the central may or may not have it; the spool re-sends with the same
        # id and the central dedupes, so keeping it costs nothing and loses nothing.
        leftovers = list(self._inflight.values())
        self._inflight.clear()
        while not self._queue.empty():
            leftovers.append(self._queue.get_nowait())
        for key, batch in leftovers:
            await self._spool(await self._encode(key, batch))

    # -- intake ----------------------------------------------------------------------------------

    async def submit(self, samples: Sequence[Sample], health: Sequence[CollectorHealth]) -> None:
        now = asyncio.get_running_loop().time()
        batches = self.batcher.add(samples, health, now)
        # While the central is unreachable every scrape goes to the spool at once: a kill -9 then
        # loses at most the scrape in progress, not an open batch of batch_max_seconds.
        if self.batcher.due(now) or not self.link.up:
            flushed = self.batcher.flush()
            batches += [flushed] if flushed is not None else []
        for batch in batches:
            await self._enqueue(batch)
        if self.batcher.deadline() is not None:
            self._opened.set()

    async def _enqueue(self, batch: Batch) -> None:
        key = self.spool.next_key(int(self._clock.time() * 1e9))
        try:
            self._queue.put_nowait((key, batch))
        except asyncio.QueueFull:
            await self._spool(await self._encode(key, batch))

    async def _timer(self) -> None:
        """Close the open batch when it reaches ``batch_max_seconds``."""
        loop = asyncio.get_running_loop()
        while True:
            await self._opened.wait()
            deadline = self.batcher.deadline()
            if deadline is None:
                self._opened.clear()
                continue
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            if self.batcher.due(loop.time()):
                batch = self.batcher.flush()
                if batch is not None:
                    await self._enqueue(batch)

    async def _encode(self, key: int, batch: Batch) -> Encoded:
        cfg = self.settings.transport
        body = await asyncio.to_thread(encode, batch, self.content_type, cfg.compress, self.wire_version)
        return Encoded(key, batch.batch_id, body, len(batch.samples))

    # -- live path -------------------------------------------------------------------------------

    async def _live_worker(self) -> None:
        while True:
            key, batch = await self._queue.get()
            # Registered until settled: if close() cancels this worker mid-send, close() spools it.
            self._inflight[batch.batch_id] = (key, batch)
            try:
                await self._deliver_live(await self._encode(key, batch))
            except Exception as exc:  # a bug or an unencodable batch must not stop the worker
                self.metrics.drop("invalid")
                log.exception(
                    "batch dropped: cannot be encoded or sent",
                    extra={"fields": {"batch_id": batch.batch_id, "error": repr(exc)}},
                )
            finally:
                self._queue.task_done()
            self._inflight.pop(batch.batch_id, None)

    async def _deliver_live(self, enc: Encoded) -> None:
        loop = asyncio.get_running_loop()
        grant = self.link.claim(loop.time())
        if grant is None:
            await self._spool(enc)
            return
        result = await self._attempt(enc.batch_id, enc.body)
        if result.outcome is Outcome.SENT:
            self._acknowledged(enc.batch_id, result)
        elif result.outcome is Outcome.RETRY:
            self._link_failed(grant, result)
            await self._spool(enc)
        else:
            await self._quarantine_live(enc, result)

    # -- backlog ---------------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Send the spool oldest first, one at a time, at most ``drain_batches_per_second``."""
        interval = 1.0 / self.settings.spool.drain_batches_per_second
        while True:
            try:
                now = asyncio.get_running_loop().time()
                entry = await asyncio.to_thread(self.spool.oldest, self._parked.keys(now))
                if entry is None:
                    await self._wait_wake(self._parked.wait_seconds(now))
                    continue
                if not await self._drain_one(entry):
                    continue
            except Exception:  # keep draining whatever one file or one request did
                log.exception("spool drain step failed; retrying")
                await asyncio.sleep(self.settings.transport.backoff_max_seconds)
            await asyncio.sleep(interval)

    async def _wait_wake(self, seconds: float | None) -> None:
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that races
        # with the event (CPython gh-86296), and close() would then wait for the drain forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake_drain.wait()
        self._wake_drain.clear()

    async def _drain_one(self, entry: Entry) -> bool:
        """Try the oldest spooled batch; True when a request was made (rate limit applies)."""
        loop = asyncio.get_running_loop()
        spooled = await self._read_entry(entry)
        if spooled is None:
            return False
        grant = self.link.claim(loop.time())
        if grant is None:
            await self._wait_wake(self.link.wait_seconds(loop.time()))
            return False
        self.metrics.retried.inc()
        result = await self._attempt(spooled.batch_id, spooled.body)
        if result.outcome is Outcome.SENT:
            self._parked.discard(entry.seq)
            await asyncio.to_thread(self.spool.remove, entry)
            self._acknowledged(spooled.batch_id, result)
        elif ours_is_read(result, self.wire_version):
            park(self._parked, self.link, grant, entry.seq, asyncio.get_running_loop().time(), result)
        elif result.outcome is Outcome.RETRY:
            self._link_failed(grant, result)
        else:
            await self._quarantine_entry(entry, f"rejected by the central: {result.reason}", "rejected")
        self._update_spool_gauges()
        return True

    async def _read_entry(self, entry: Entry) -> SpooledBatch | None:
        try:
            return await asyncio.to_thread(self.spool.read, entry)
        except FileNotFoundError:
            return None  # dropped to make room meanwhile
        except CorruptSpoolFile as exc:
            await self._quarantine_entry(entry, f"corrupt spool file: {exc}", "corrupt")
        except OSError as exc:
            await self._quarantine_entry(entry, f"unreadable spool file: {exc}", "corrupt")
        return None

    # -- outcomes --------------------------------------------------------------------------------

    async def _attempt(self, batch_id: str, body: bytes) -> SendResult:
        assert self._sender is not None, "Transport.start() was not called"
        gz = self.settings.transport.compress
        with self.metrics.send_duration.time():
            return await self._sender.send(batch_id, body, self.content_type, gz)

    def _acknowledged(self, batch_id: str, result: SendResult) -> None:
        self.metrics.sent.inc()
        self.sent_batches += 1
        self.metrics.last_success.set(self._clock.time())
        self.metrics.central_up.set(1)
        if result.duplicate:
            logs.event(log, logging.DEBUG, "central already had batch", batch_id=batch_id)
        if self.link.succeeded():
            logs.event(
                log, logging.INFO, "central reachable again; draining the spool", spooled_batches=len(self.spool)
            )
        self._wake_drain.set()

    def _link_failed(self, grant: Grant, result: SendResult) -> None:
        now = asyncio.get_running_loop().time()
        self.metrics.central_up.set(0)
        if self.link.failed(grant, now, result.reason, result.retry_after):
            logs.event(
                log,
                logging.WARNING,
                outage_message(result, self.wire_version),
                reason=result.reason,
                retry_in_seconds=round(self.link.retry_at - now, 3),
            )
        else:
            logs.event(
                log,
                logging.DEBUG,
                "send failed",
                reason=result.reason,
                retry_in_seconds=round(self.link.retry_at - now, 3),
            )
        self._wake_drain.set()

    async def _spool(self, enc: Encoded) -> None:
        try:
            dropped = await asyncio.to_thread(self.spool.put, enc.batch_id, enc.body, self._flags, enc.key)
        except SpoolWriteError as exc:
            self.metrics.drop(exc.reason)
            logs.event(
                log,
                logging.ERROR,
                "cannot spool batch; dropped",
                batch_id=enc.batch_id,
                samples=enc.samples,
                reason=exc.reason,
                error=str(exc),
            )
            return
        self.metrics.spooled.inc()
        if dropped:
            self.metrics.drop("spool_full", len(dropped))
            logs.event(
                log,
                logging.WARNING,
                "spool full; dropped oldest batches",
                dropped=len(dropped),
                max_bytes=self.spool.max_bytes,
            )
        self._update_spool_gauges()
        self._wake_drain.set()

    async def _quarantine_entry(self, entry: Entry, reason: str, drop_reason: str) -> None:
        target = await asyncio.to_thread(self.spool.quarantine, entry, reason)
        self.metrics.quarantined.inc()
        self.metrics.drop(drop_reason)
        logs.event(log, logging.ERROR, "spooled batch quarantined", file=str(target), reason=reason)
        self._update_spool_gauges()

    async def _quarantine_live(self, enc: Encoded, result: SendResult) -> None:
        self.metrics.drop("rejected")
        reason = f"rejected by the central: {result.reason}"
        data = pack(enc.batch_id, enc.body, self._flags)
        try:
            target = await asyncio.to_thread(self.spool.quarantine_bytes, enc.batch_id, data, reason)
        except SpoolWriteError as exc:
            logs.event(
                log, logging.ERROR, "batch rejected; not kept", batch_id=enc.batch_id, reason=reason, error=str(exc)
            )
            return
        self.metrics.quarantined.inc()
        logs.event(
            log, logging.ERROR, "batch rejected; quarantined", batch_id=enc.batch_id, file=str(target), reason=reason
        )

    def _update_spool_gauges(self) -> None:
        self.metrics.spool_bytes.set(self.spool.size_bytes)
        self.metrics.spool_batches.set(len(self.spool))
