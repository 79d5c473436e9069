"""The bus's own throughput with a Python client (nats-py, JetStream at 127.0.0.1:4222): the
baseline the central's ingest through the bus is compared with.

``bare``: publish the encoded batches to a work-queue stream (each with its ``Nats-Msg-Id``, acked
by JetStream, ``WINDOW`` publishes in flight as an agent fleet would have), then pull and ack them
all with one durable consumer, as ``fabricd/server/bus_consumer.py`` does. Samples/s counts the
samples in the batches carried, from the first publish to the last acknowledgement.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

NATS_URL = "nats://127.0.0.1:4222"
WINDOW = 64  # publishes awaiting JetStream's acknowledgement at once
FETCH = 64  # messages per pull, as the central's consumer


def prefix() -> str:
    """A subject prefix (and stream) of its own per run: runs never see each other's messages."""
    return f"bench{uuid.uuid4().hex[:10]}"


async def publish(js: Any, names: Any, batches: list[Any], bodies: list[bytes]) -> None:
    from fabricd.bus import BATCH_ID, CONTENT_ENCODING, CONTENT_TYPE, MSG_ID

    async def one(batch: Any, body: bytes) -> None:
        headers = {CONTENT_TYPE: "application/msgpack", CONTENT_ENCODING: "gzip", BATCH_ID: batch.batch_id}
        await js.publish(names.subject(batch.node), body, headers={**headers, MSG_ID: batch.batch_id})

    for k in range(0, len(bodies), WINDOW):
        await asyncio.gather(
            *(one(b, body) for b, body in zip(batches[k : k + WINDOW], bodies[k : k + WINDOW], strict=True))
        )


async def ensure_stream(js: Any, names: Any) -> None:
    from nats.js.api import RetentionPolicy, StreamConfig

    from fabricd.bus import DUPLICATE_WINDOW_SECONDS

    config = StreamConfig(
        name=names.stream,
        subjects=[names.subjects],
        retention=RetentionPolicy.WORK_QUEUE,
        duplicate_window=DUPLICATE_WINDOW_SECONDS,
    )
    await js.add_stream(config)


async def _bare(batches: list[Any], bodies: list[bytes]) -> dict[str, float]:
    import nats

    from fabricd.bus import BusNames

    names = BusNames(prefix())
    nc = await nats.connect(servers=[NATS_URL], connect_timeout=5)
    try:
        js = nc.jetstream(timeout=30)
        await ensure_stream(js, names)
        samples = sum(len(b.samples) for b in batches)
        start = time.perf_counter()
        await publish(js, names, batches, bodies)
        published = time.perf_counter()
        sub = await js.pull_subscribe(names.subjects, durable=names.durable, stream=names.stream)
        got = 0
        while got < len(bodies):
            msgs = await sub.fetch(FETCH, timeout=5)
            for msg in msgs:
                await msg.ack()
            got += len(msgs)
        end = time.perf_counter()
        await js.delete_stream(names.stream)
    finally:
        await nc.close()
    return {
        "publish": samples / (published - start),
        "consume": samples / (end - published),
        "bus": samples / (end - start),
    }


def bare(batches: list[Any], bodies: list[bytes]) -> dict[str, float]:
    """samples/s: publish alone, consume alone, and through the bus end to end."""
    return asyncio.run(_bare(batches, bodies))


def publish_all(stream_prefix: str, batches: list[Any], bodies: list[bytes]) -> None:
    """Publish the batches where a central consuming ``stream_prefix`` reads them (it made the stream)."""
    import nats

    from fabricd.bus import BusNames

    async def go() -> None:
        nc = await nats.connect(servers=[NATS_URL], connect_timeout=5)
        try:
            await publish(nc.jetstream(timeout=30), BusNames(stream_prefix), batches, bodies)
        finally:
            await nc.close()

    asyncio.run(go())


def delete_stream(stream_prefix: str) -> None:
    import nats

    from fabricd.bus import BusNames

    async def go() -> None:
        nc = await nats.connect(servers=[NATS_URL], connect_timeout=5)
        try:
            await nc.jetstream(timeout=30).delete_stream(BusNames(stream_prefix).stream)
        finally:
            await nc.close()

    asyncio.run(go())


def reachable() -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", 4222), timeout=2):
            return True
    except OSError:
        return False
