"""Pingmesh on a prober whose event loop stalls: replies that reached the host in time are neither
lost nor slow (``fabricd.udpstamp``: the kernel's receive time decides on time; RTTs stay read
times except for replies read after their timeout, ``Ledger.on_reply``)."""

from __future__ import annotations

import asyncio
import threading
import time
from itertools import pairwise
from typing import Any

from collectors.pingmesh import PingmeshCollector, PingmeshFactories
from fabricd.probe import ResponderProtocol
from fabricd.probe_ledger import Ledger
from fabricd.signal_math import loss_ratio
from tests.test_pingmesh import _by_counter, _mesh

PATH_SECONDS = 0.05  # each reply leaves the responder this long after its probe came in
TIMEOUT_SECONDS = 0.4
STALL_SECONDS = 1.0  # past the timeout: read when the loop comes back, every reply in flight is "lost"
RESPONDER_STALL_SECONDS = 0.7  # past the timeout, within the settling after it (collectors/pingmesh.py)


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
        self.server: PingmeshCollector | None = None

    def run(self) -> None:
        asyncio.run(self._serve())

    def stall(self, seconds: float) -> bool:
        """Block the responder's loop for ``seconds`` (a busy host), from now."""
        if self._loop is None:
            return False
        self._loop.call_soon_threadsafe(time.sleep, seconds)
        return True

    def collect(self) -> dict[str, float]:
        """The responder's own counts (``device`` empty), collected on its loop."""
        assert self._loop is not None and self.server is not None
        return _by_counter(asyncio.run_coroutine_threadsafe(self.server.collect(), self._loop).result(10), "")

    def stop(self) -> None:
        if self._loop is not None and self._done is not None:
            self._loop.call_soon_threadsafe(self._done.set)
        self.join(10)

    async def _serve(self) -> None:
        self._loop, self._done = asyncio.get_running_loop(), asyncio.Event()
        server = _mesh({"listen_address": "127.0.0.1", "listen_port": 0}, PingmeshFactories(responder=_SlowPath))
        await server.collect()
        self.server, self.port = server, server.listen_port
        self.ready.set()
        await self._done.wait()
        await server.close()


def _peer_and_prober(rate_per_second: int) -> tuple[_ResponderThread, PingmeshCollector]:
    """The peer started on its own thread, and a prober of it (not answering, ``TIMEOUT_SECONDS``)."""
    peer = _ResponderThread()
    peer.start()
    assert peer.ready.wait(10)
    peers = [{"name": "srv", "address": "127.0.0.1", "port": peer.port, "rate_per_second": rate_per_second}]
    client: PingmeshCollector = _mesh({"peers": peers, "respond": False, "timeout_seconds": TIMEOUT_SECONDS})
    return peer, client


async def test_a_stalled_probers_replies_that_arrived_in_time_are_neither_lost_nor_late() -> None:
    peer, client = _peer_and_prober(rate_per_second=200)
    try:
        await client.collect()
        await asyncio.sleep(0.3)  # ~10 probes in flight at any moment (200/s, 50 ms each)
        time.sleep(STALL_SECONDS)  # noqa: ASYNC251 - the point: the loop stalls while replies arrive
        # The scrape runs before the socket's reader does, as it may after a stall.
        got = _by_counter(await client.collect(), "srv")
        assert (got["probes_lost"], got["probes_late"]) == (0, 0)
        assert got["probes_received"] >= 20
        # Read after their timeout, they are timed at arrival: the path's 50 ms, not the stall's second.
        assert got["rtt_min"] >= PATH_SECONDS and got["rtt_max"] < TIMEOUT_SECONDS
        client.stop_probing()
        await asyncio.sleep(2 * TIMEOUT_SECONDS)
        got = _by_counter(await client.collect(), "srv")
        assert got["probes_received"] == got["probes_sent"] and got["probes_lost"] == 0
    finally:
        await client.close()
        peer.stop()


async def test_a_stalled_responders_late_replies_land_in_the_scrape_of_their_loss() -> None:
    """The responder's loop stalls past the timeout, and a scrape falls inside the stall: the probes
    already past their timeout are not reported lost there (their replies may still come) but in the
    next scrape, with their replies, as lost and late alike; the signal counts none of them lost
    (``fabricd.signal_math.loss_ratio``). Reporting them at their timeout put the loss in the first
    scrape and the late replies in the second, where no per-scrape ratio can take the loss back."""
    peer, client = _peer_and_prober(rate_per_second=100)
    try:
        await client.collect()
        await asyncio.sleep(0.3)
        before = _by_counter(await client.collect(), "srv")
        assert peer.stall(RESPONDER_STALL_SECONDS)
        await asyncio.sleep(TIMEOUT_SECONDS + 0.2)  # the first probes of the stall are past their timeout
        during = _by_counter(await client.collect(), "srv")
        await asyncio.sleep(RESPONDER_STALL_SECONDS)  # the stall is over, its replies came back late
        after = _by_counter(await client.collect(), "srv")
    finally:
        await client.close()
        peer.stop()
    scrapes = [before, during, after]
    deltas = [{k: b[k] - a[k] for k in ("probes_sent", "probes_lost", "probes_late")} for a, b in pairwise(scrapes)]
    assert deltas[0]["probes_lost"] == deltas[0]["probes_late"] == 0
    assert deltas[1]["probes_lost"] == deltas[1]["probes_late"] >= 10
    assert [loss_ratio((d["probes_sent"], d["probes_lost"], d["probes_late"])) for d in deltas] == [0.0, 0.0]


async def test_a_stalled_responder_counts_the_requests_it_held_and_drops_none() -> None:
    """The requests that reached the responder's host during its stall, read when it came back at
    least ``HELD_LATE_NS`` after they arrived, are counted (``responder_late_answers``: the central
    does not count its probers' loss then, ``fabricd.detect.responders``); its queue dropped none."""
    peer, client = _peer_and_prober(rate_per_second=100)
    try:
        await client.collect()
        await asyncio.sleep(0.3)
        before = peer.collect()
        sent_before = _by_counter(await client.collect(), "srv")["probes_sent"]
        assert peer.stall(RESPONDER_STALL_SECONDS)
        await asyncio.sleep(RESPONDER_STALL_SECONDS + 0.3)
        after = peer.collect()
        sent_after = _by_counter(await client.collect(), "srv")["probes_sent"]
    finally:
        await client.close()
        peer.stop()
    assert before["responder_late_answers"] == 0
    # Those that came in the stall's first 0.45 s (held 0.25 s and more): ~45 at 100/s, of the ~100
    # sent since the first scrape.
    assert 0 < after["responder_late_answers"] < sent_after - sent_before
    assert after["responder_socket_drops"] == 0


MS = 1_000_000


def test_a_reply_is_on_time_by_its_arrival_and_timed_when_read_unless_read_past_the_timeout() -> None:
    ledger = Ledger(timeout_ns=100 * MS)
    for seq in range(4):
        ledger.on_send(seq, 0)
    ledger.on_reply(0, now_ns=30 * MS, arrival_ns=10 * MS)  # read late, within the timeout: the read time
    ledger.on_reply(1, now_ns=500 * MS, arrival_ns=20 * MS)  # read past the timeout, arrived in time
    ledger.on_reply(2, now_ns=500 * MS, arrival_ns=150 * MS)  # arrived past the timeout: lost, then late
    ledger.expire(500 * MS)  # seq 3: no reply
    got = ledger.counts()
    assert (got.received, got.lost, got.late, got.in_flight) == (2, 2, 1, 0)
    rtt = ledger.take_rtt()
    assert rtt is not None and (rtt.count, rtt.min, rtt.max) == (2, 0.02, 0.03)


def test_without_a_stamp_a_reply_is_timed_and_expired_at_its_read() -> None:
    ledger = Ledger(timeout_ns=100 * MS)
    ledger.on_send(0, 0)
    ledger.on_send(1, 0)
    ledger.on_reply(0, now_ns=40 * MS)
    ledger.on_reply(1, now_ns=120 * MS)
    got = ledger.counts()
    assert (got.received, got.lost, got.late) == (1, 1, 1)
