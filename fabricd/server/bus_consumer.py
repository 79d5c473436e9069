"""The central's side of the bus: a durable JetStream consumer feeding the ingest path (``bus.url``).

Each message is a batch as an agent would POST it (fabricd/bus.py), decoded and stored by
``Ingestor.ingest_body`` like an HTTP ingest: the same limits, the same batch id check (a batch
the stream redelivers after a lost acknowledgement is acknowledged again, not stored twice). A
message is acknowledged after its batch is committed; a batch refused for good (bad body, schema)
is terminated and counted in ``fabricd_ingest_rejected_batches_total``; a transient refusal (the
store busy or down) is redelivered later. NATS unreachable: retried with backoff, logged once per
outage, while HTTP ingest goes on.

A single central consumes every subject with one durable consumer (``run()``); a replica
(fabricd/server/replica.py) consumes each partition it claimed with that partition's own durable
consumer (``run(partition)``), so a partition's batches are stored by one process at a time, in
order, and a partition handed over resumes where its last owner acknowledged. A work-queue stream
takes several consumers as long as their subjects do not overlap: the single central's consumer
and the replicas' cannot run on one stream at once (docs/operations.md, "Replicas").

The bus has no bearer token: whoever may publish on the stream's subjects may send for any node
(NATS accounts and permissions guard that, docs/transport.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import anyio.to_thread

from fabricd import logs
from fabricd.bus import CONTENT_ENCODING, CONTENT_TYPE, DUPLICATE_WINDOW_SECONDS, BusNames
from fabricd.server.auth import Principal
from fabricd.server.errors import ApiError
from fabricd.server.ingest import Body, Ingestor, check_content
from fabricd.settings import BusSettings

log = logging.getLogger("fabricd.server.bus")
BUS = Principal("agent", None, "bus")
FETCH_BATCH = 64  # messages per pull; each is one agent batch
PARTITION_FETCH = 16
RETRY_DELAY_SECONDS = 2.0  # redelivery delay of a batch the store could not take now


class BusConsumer:
    def __init__(self, bus: BusSettings, ingestor: Ingestor, ack_wait_seconds: float = 30.0) -> None:
        self.bus, self.ingestor, self.ack_wait_seconds = bus, ingestor, ack_wait_seconds
        self.names = BusNames(bus.prefix, bus.partitions)
        self.stored = 0  # batches this consumer stored (tests, status)

    async def run(self, partition: int | None = None) -> None:
        """Until cancelled: connect, make sure the stream exists, consume (every subject, or one
        partition's); reconnect on failure. Cancelled, it returns after the batch being stored
        (the store runs in a thread to the end), so a released partition has no writer left."""
        import nats

        delay, down = 0.5, False
        while True:
            try:
                nc = await nats.connect(servers=[self.bus.url], connect_timeout=5, allow_reconnect=False)
            except (TimeoutError, nats.errors.Error, OSError) as exc:
                if not down:
                    logs.event(log, logging.WARNING, "NATS unreachable; retrying", url=self.bus.url, error=repr(exc))
                down = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            if down:
                logs.event(log, logging.INFO, "NATS reachable again", url=self.bus.url)
            delay, down = 0.5, False
            try:
                await self._consume(nc, partition)
            except (TimeoutError, nats.errors.Error, OSError) as exc:
                logs.event(log, logging.WARNING, "NATS connection lost; reconnecting", error=repr(exc))
            finally:
                try:
                    await nc.close()
                except Exception:  # already broken
                    pass

    async def _consume(self, nc: Any, partition: int | None) -> None:
        import nats
        from nats.js.api import ConsumerConfig, RetentionPolicy, StreamConfig

        js = nc.jetstream(timeout=10)
        config = StreamConfig(
            name=self.names.stream,
            subjects=[self.names.subjects],
            retention=RetentionPolicy.WORK_QUEUE,  # a message lives until the central stored it
            duplicate_window=DUPLICATE_WINDOW_SECONDS,
        )
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError:  # exists with another config: keep the operator's
            await js.stream_info(self.names.stream)
        if partition is None:
            subjects, durable, fetch, config_ = self.names.subjects, self.names.durable, FETCH_BATCH, None
        else:
            subjects, durable = self.names.partition_subjects(partition), self.names.partition_durable(partition)
            # Unacknowledged batches of a replica killed -9 come back after ack_wait: shorter than the
            # lease, so they are due when the next owner claims and come first, in order (fetch is
            # smaller so a loaded replica stores what it fetched within ack_wait).
            fetch, config_ = PARTITION_FETCH, ConsumerConfig(ack_wait=self.ack_wait_seconds)
        sub = await js.pull_subscribe(subjects, durable=durable, stream=self.names.stream, config=config_)
        logs.event(
            log,
            logging.INFO,
            "consuming batches from NATS",
            stream=self.names.stream,
            url=self.bus.url,
            subjects=subjects,
        )
        while True:
            try:
                msgs = await sub.fetch(fetch, timeout=1.0)
            except (nats.errors.TimeoutError, TimeoutError):  # nothing to fetch (builtin: a loaded host)
                if nc.is_closed:
                    raise nats.errors.ConnectionClosedError from None
                continue
            await self._all(msgs)

    async def _all(self, msgs: list[Any]) -> None:
        """Store one fetch: each node's batches in order, the nodes at once, so that the writer's
        group commit stores them in a few transactions; one by one, every batch paid a transaction
        and a thread hop of its own. A node's batches share a subject
        (``fabricd.samples.<partition>.<node>``)."""
        by_subject: dict[str, list[Any]] = {}
        for msg in msgs:
            by_subject.setdefault(msg.subject, []).append(msg)
        # Plain tasks, not a task group: a task group raises an ExceptionGroup, which the reconnect
        # loop would not catch (a lost connection fails every acknowledgement of the fetch), and
        # the replica cancels this task natively. Cancelled, gather cancels the node tasks and
        # returns once each has finished the batch its thread is storing.
        tasks = [asyncio.create_task(self._in_order(run)) for run in by_subject.values()]
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _in_order(self, msgs: list[Any]) -> None:
        for msg in msgs:
            await self._one(msg)

    async def _one(self, msg: Any) -> None:
        headers = msg.headers or {}
        try:
            base, gzipped = check_content(headers.get(CONTENT_TYPE), headers.get(CONTENT_ENCODING))
            await _to_the_end(self.ingestor.ingest_body, BUS, Body(msg.data, base, gzipped))
        except ApiError as exc:
            if exc.status == 429:  # series limit or overload: may pass later
                await msg.nak(delay=RETRY_DELAY_SECONDS)
                return
            logs.event(log, logging.ERROR, "batch on the bus refused; dropped", subject=msg.subject, error=str(exc))
            await msg.term()
            return
        except Exception:  # the store failed: redeliver it later, nothing is lost
            log.exception("storing a batch from the bus failed; it will be redelivered")
            await msg.nak(delay=RETRY_DELAY_SECONDS)
            return
        await msg.ack()
        self.stored += 1


async def _to_the_end(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread; cancelled meanwhile, this waits for the thread to finish
    before it re-raises, so a released partition or a stopping replica leaves no writer behind (a
    native cancel ends ``anyio.to_thread.run_sync`` at once, the thread still storing). The batch
    stored then is not acknowledged: redelivered, it is a duplicate, acknowledged by the next owner."""
    job = asyncio.ensure_future(anyio.to_thread.run_sync(fn, *args))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        await asyncio.wait([job])
        if not job.cancelled():
            job.exception()  # retrieved: the redelivery says what happens to the batch
        raise
