"""Pingmesh on a prober whose event loop stalls: replies that reached the host in time are neither
lost nor slow (``fabricd.udpstamp``: the kernel's receive time, not the read time)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

from collectors.pingmesh import PingmeshCollector, PingmeshFactories
from fabricd.probe import ResponderProtocol
from fabricd.udpstamp import bind_own_port
from tests.test_pingmesh import _by_counter, _mesh

PATH_SECONDS = 0.05  # each reply leaves the responder this long after its probe came in
TIMEOUT_SECONDS = 0.4
STALL_SECONDS = 1.0  # past the timeout: read when the loop comes back, every reply in flight is "lost"


class _SlowPath(ResponderProtocol):
    def datagram_received(self, data: bytes, addr: Any) -> None:
        asyncio.get_running_loop().call_later(PATH_SECONDS, super().datagram_received, data, addr)


class _ResponderThread(threading.Thread):
    """The peer on its own event loop: only the prober's loop stalls, as on two hosts."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.port = 0
        self.ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Event | None = None

    def run(self) -> None:
        asyncio.run(self._serve())

    def stop(self) -> None:
        if self._loop is not None and self._done is not None:
            self._loop.call_soon_threadsafe(self._done.set)
        self.join(10)

    async def _serve(self) -> None:
        self._loop, self._done = asyncio.get_running_loop(), asyncio.Event()
        server = _mesh({"listen_address": "127.0.0.1", "listen_port": 0}, PingmeshFactories(responder=_SlowPath))
        await server.collect()
        self.port = server.listen_port
        self.ready.set()
        await self._done.wait()
        await server.close()


async def test_a_stalled_probers_replies_that_arrived_in_time_are_neither_lost_nor_late() -> None:
    peer = _ResponderThread()
    peer.start()
    assert peer.ready.wait(10)
    client: PingmeshCollector = _mesh(
        {
            "peers": [{"name": "srv", "address": "127.0.0.1", "port": peer.port, "rate_per_second": 200}],
            "respond": False,
            "timeout_seconds": TIMEOUT_SECONDS,
        }
    )
    try:
        await client.collect()
        await asyncio.sleep(0.3)  # ~10 probes in flight at any moment (200/s, 50 ms each)
        time.sleep(STALL_SECONDS)  # noqa: ASYNC251 - the point: the loop stalls while replies arrive
        # The scrape runs before the socket's reader does, as it may after a stall.
        got = _by_counter(await client.collect(), "srv")
        assert (got["probes_lost"], got["probes_late"]) == (0, 0)
        assert got["probes_received"] >= 20
        # RTTs from the kernel's receive times: the path's 50 ms, not the stall's second.
        assert got["rtt_min"] >= PATH_SECONDS and got["rtt_max"] < TIMEOUT_SECONDS
        client.stop_probing()
        await asyncio.sleep(2 * TIMEOUT_SECONDS)
        got = _by_counter(await client.collect(), "srv")
        assert got["probes_received"] == got["probes_sent"] and got["probes_lost"] == 0
    finally:
        await client.close()
        peer.stop()


def test_a_probers_reuse_port_socket_gets_a_port_no_other_socket_holds() -> None:
    # bind(port 0) with SO_REUSEPORT may return a port another reuse-port socket holds (62 of 2,000
    # here), and the kernel then splits that port's replies between the two: CI's live demo lost
    # every reply of one pair to another agent's prober. bind_own_port never shares.
    held = []
    try:
        for _ in range(1000):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("0.0.0.0", 0))
            held.append(s)
        taken = [s.getsockname()[1] for s in held]
        mine = []
        for _ in range(300):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            held.append(s)
            mine.append(bind_own_port(s, "0.0.0.0"))
        assert not set(mine) & set(taken)
        assert len(set(mine)) == len(mine)
    finally:
        for s in held:
            s.close()
