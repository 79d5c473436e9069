"""HTTP ingest on a replica: the batch goes to the bus, and its partition's owner stores it.

Among replicas each partition has one writer at a time (fabricd/server/partition_stream.py says
why detection needs that), so a replica does not store what an agent POSTs to it: it checks and
decodes the batch as always (a bad one is refused here, with the HTTP error), publishes it to its
node's subject, and answers once JetStream has stored it (``PubAck``). ``Nats-Msg-Id`` is the
batch id, as an agent's own publish: a retry through another replica is JetStream's duplicate,
and past the duplicate window the owner's batch id check. The agent then hears what it hears from
a single central: accepted, or duplicate. NATS unreachable is a 503: the agent spools and retries.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any

from fabricd import wire
from fabricd.bus import BATCH_ID, CONTENT_ENCODING, CONTENT_TYPE, MSG_ID, BusNames
from fabricd.model import Batch
from fabricd.server.errors import ApiError
from fabricd.server.store.records import IngestResult
from fabricd.settings import BusSettings

log = logging.getLogger("fabricd.server.forward")
PUBLISH_TIMEOUT_SECONDS = 10.0


class BusForwarder:
    """A ``BatchSink`` (``Ingestor``'s) that publishes instead of storing; ``ingest`` is called from a
    worker thread and publishes on the event loop ``start`` ran on."""

    def __init__(self, bus: BusSettings, timeout_seconds: float = PUBLISH_TIMEOUT_SECONDS) -> None:
        self.url, self.timeout = bus.url, timeout_seconds
        self.names = BusNames(bus.prefix, bus.partitions)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._js: Any = None
        self._nc: Any = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    def ingest(self, batch: Batch, now: float, max_series_per_node: int) -> IngestResult:
        body = wire.encode(batch)
        if self._loop is None:
            raise ApiError(503, "starting", "the replica is starting; retry shortly", {"Retry-After": "2"})
        future = asyncio.run_coroutine_threadsafe(self._publish(batch, body), self._loop)
        try:
            duplicate = future.result(self.timeout + 1.0)
        except (concurrent.futures.TimeoutError, TimeoutError, OSError) as exc:
            raise _unavailable(exc) from exc
        except Exception as exc:
            if type(exc).__module__.startswith("nats"):
                raise _unavailable(exc) from exc
            raise
        return IngestResult(batch.batch_id, 0 if duplicate else len(batch.samples), duplicate)

    async def _publish(self, batch: Batch, body: bytes) -> bool:
        headers = {
            CONTENT_TYPE: wire.MSGPACK,
            CONTENT_ENCODING: "gzip",
            BATCH_ID: batch.batch_id,
            MSG_ID: batch.batch_id,
        }
        try:
            js = await self._connected()
            ack = await js.publish(self.names.subject(batch.node), body, timeout=self.timeout, headers=headers)
        except BaseException:
            await self._drop()  # connect afresh on the next batch
            raise
        return bool(ack.duplicate)

    async def _connected(self) -> Any:
        async with self._lock:
            if self._js is None:
                import nats

                self._nc = await nats.connect(servers=[self.url], connect_timeout=5, allow_reconnect=False)
                self._js = self._nc.jetstream(timeout=self.timeout)
            return self._js

    async def _drop(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            try:
                await nc.close()
            except Exception:  # already broken
                pass

    async def aclose(self) -> None:
        await self._drop()


def _unavailable(exc: BaseException) -> ApiError:
    log.warning("forwarding a batch to NATS failed: %r", exc)
    return ApiError(503, "bus_unavailable", f"NATS: {type(exc).__name__}: {exc}", {"Retry-After": "5"})
