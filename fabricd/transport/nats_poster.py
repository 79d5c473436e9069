"""A ``Poster`` that publishes to NATS JetStream instead of POSTing (``bus.url``; fabricd/bus.py).

The transport stays what it is: batching, the spool, retries with backoff, the drain order. Only
the last hop changes. A publish JetStream acknowledged (``PubAck``, the message is stored) is a
200; ``PubAck.duplicate`` (the same ``Nats-Msg-Id`` within the duplicate window) is the central's
"duplicate": true. No connection, a timeout or no stream answering is a ``PostError``: the
transport retries and spools exactly as when the central is down.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fabricd.bus import BATCH_ID, CONTENT_ENCODING, CONTENT_TYPE, MSG_ID, BusNames
from fabricd.settings import BusSettings
from fabricd.transport.sender import PostError, PostResult


class NatsPoster:
    def __init__(self, bus: BusSettings, node: str, timeout_seconds: float) -> None:
        import nats  # the 'bus' extra; checked at start by the agent's wiring

        self._nats = nats
        self.url, self.timeout = bus.url, timeout_seconds
        self.subject = BusNames(bus.prefix, bus.partitions).subject(node)
        self._nc: Any = None
        self._js: Any = None

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> PostResult:
        batch_id = headers[BATCH_ID]
        carried = {k: headers[k] for k in (CONTENT_TYPE, CONTENT_ENCODING, BATCH_ID) if k in headers}
        try:
            js = await self._connected()
            ack = await js.publish(self.subject, body, timeout=self.timeout, headers={**carried, MSG_ID: batch_id})
        except (TimeoutError, self._nats.errors.Error, OSError) as exc:
            await self._drop()  # connect afresh on the next attempt
            raise PostError(f"NATS {self.url}: {type(exc).__name__}: {exc}") from exc
        return PostResult(200, {}, json.dumps({"duplicate": bool(ack.duplicate), "stream_seq": ack.seq}))

    async def _connected(self) -> Any:
        if self._js is None:
            # No reconnect loop inside nats-py: the transport's backoff and spool decide when to try.
            self._nc = await self._nats.connect(
                servers=[self.url],
                connect_timeout=min(self.timeout, 5.0),
                allow_reconnect=False,
                max_reconnect_attempts=0,
            )
            self._js = self._nc.jetstream(timeout=self.timeout)
        return self._js

    async def _drop(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            try:
                await nc.close()
            except Exception:  # already broken: nothing more to release
                pass

    async def aclose(self) -> None:
        await self._drop()
