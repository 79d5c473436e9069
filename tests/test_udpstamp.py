"""A socket's own drops, told apart from the network's (``fabricd.udpstamp``, ``Ledger``'s host drops).

Real UDP sockets on loopback: nothing but the receiving socket's queue drops a datagram there, so
every datagram sent is either read or counted in the socket's drops, exactly."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

import collectors.pingmesh as pingmesh
from fabricd.probe_ledger import Ledger
from fabricd.udpstamp import StampedEndpoint, receive_buffer, socket_drops
from tests.test_pingmesh import _by_counter
from tests.test_pingmesh_stall import TIMEOUT_SECONDS, _peer_and_prober

SMALLEST_QUEUE = 1  # the kernel rounds a request up to its minimum (SOCK_MIN_RCVBUF x 2: 4.5 KiB)
MS = 1_000_000


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    yield receiver, sender
    receiver.close()
    sender.close()


def _flood(sender: socket.socket, to: Any, count: int) -> None:
    for seq in range(count):
        sender.sendto(seq.to_bytes(4, "big"), to)


def _endpoint(receiver: socket.socket) -> tuple[StampedEndpoint, list[tuple[str, int]]]:
    """An endpoint on ``receiver`` and what it heard, in order: ("read", seq) and ("dropped", count)."""
    heard: list[tuple[str, int]] = []
    endpoint = StampedEndpoint(
        receiver,
        lambda data, _addr, _ns: heard.append(("read", int.from_bytes(data, "big"))),
        lambda exc: None,
        time.monotonic_ns,
        lambda count: heard.append(("dropped", count)),
    )
    receiver.setblocking(False)
    return endpoint, heard


def test_every_datagram_is_read_or_counted_dropped_and_the_drops_come_before_the_next_read(pair: Any) -> None:
    receiver, sender = pair
    receive_buffer(receiver, SMALLEST_QUEUE)
    endpoint, heard = _endpoint(receiver)
    _flood(sender, receiver.getsockname(), 200)
    endpoint.drain()  # the queued ones, then the drops after the last of them (SO_MEMINFO)
    reads = [seq for what, seq in heard if what == "read"]
    drops = sum(count for what, count in heard if what == "dropped")
    assert 0 < len(reads) < 200 and reads == list(range(len(reads)))  # the queue kept the first ones
    assert heard[-1] == ("dropped", 200 - len(reads)) and drops == 200 - len(reads)
    assert socket_drops(receiver) == endpoint.drops == drops

    # Overflow again, read what was queued one datagram at a time (no SO_MEMINFO read), then one
    # more datagram: it carries the new count (SO_RXQ_OVFL), heard before the datagram itself.
    heard.clear()
    _flood(sender, receiver.getsockname(), 200)
    while endpoint._read_one():
        pass
    queued = len(heard)
    assert queued == len(reads) and all(what == "read" for what, _ in heard)
    sender.sendto((999).to_bytes(4, "big"), receiver.getsockname())
    endpoint.read_ready()
    assert heard[queued:] == [("dropped", 200 - queued), ("read", 999)]
    assert socket_drops(receiver) == endpoint.drops == drops + 200 - queued


@pytest.mark.skipif(os.geteuid() != 0, reason="a queue past net.core.rmem_max needs CAP_NET_ADMIN (SO_RCVBUFFORCE)")
def test_the_meshs_queue_holds_its_datagrams_for_the_seconds_it_is_sized_for(pair: Any) -> None:
    """24 peers at 10 probes/s: ``QUEUE_HELD_SECONDS`` of their replies, unread, all kept."""
    receiver, sender = pair
    rate, size = 24 * 10.0, 28
    granted = receive_buffer(receiver, pingmesh.queue_bytes(rate, size))
    assert granted >= pingmesh.queue_bytes(rate, size)  # the kernel doubles it: socket(7)
    count = int(rate * pingmesh.QUEUE_HELD_SECONDS)
    for _ in range(count):
        sender.sendto(bytes(size), receiver.getsockname())
    assert socket_drops(receiver) == 0
    endpoint, heard = _endpoint(receiver)
    endpoint.drain()
    assert len(heard) == count


def test_a_probe_in_flight_when_the_host_dropped_replies_is_the_hosts_not_lost() -> None:
    ledger = Ledger(timeout_ns=100 * MS)
    for seq in range(6):
        ledger.on_send(seq, seq * MS)
    ledger.on_reply(0, now_ns=20 * MS)
    ledger.on_host_drop()  # 1-5 in flight: any of their replies may be among the dropped
    ledger.on_reply(2, now_ns=30 * MS)  # one was not dropped after all
    ledger.on_send(6, 40 * MS)  # sent after the drop: its loss is the network's
    ledger.on_unsent(6)  # ... had it left: a full send buffer kept it
    ledger.on_send(7, 41 * MS)
    ledger.expire(500 * MS)
    got = ledger.counts()
    assert (got.sent, got.received, got.lost, got.host_dropped, got.in_flight) == (8, 2, 1, 5, 0)
    ledger.on_reply(3, now_ns=510 * MS)  # a host-dropped probe's reply after all, late: not "late"
    ledger.on_reply(7, now_ns=520 * MS)  # the lost one's: late, which takes its loss back
    ledger.on_reply(7, now_ns=521 * MS)  # and its copy: a duplicate
    got = ledger.counts()
    assert (got.lost, got.late, got.host_dropped, got.duplicate) == (1, 1, 5, 1)


async def test_a_stalled_probers_overflowing_socket_drops_are_its_own_not_the_fabrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The prober's queue at the kernel's minimum and its loop stalled past the timeout: the replies
    that did not fit are dropped by its own socket, and counted as the host's, none as lost. The
    peer answers every probe (its own thread), so nothing else loses one."""
    monkeypatch.setattr(pingmesh, "queue_bytes", lambda _rate, _size: SMALLEST_QUEUE)
    peer, client = _peer_and_prober(rate_per_second=200)
    try:
        await client.collect()
        await asyncio.sleep(0.3)
        time.sleep(2 * TIMEOUT_SECONDS)  # noqa: ASYNC251 - the point: ~160 replies arrive unread
        during = _by_counter(await client.collect(), "srv")
        client.stop_probing()
        await asyncio.sleep(3 * TIMEOUT_SECONDS)  # every probe answered or past its timeout
        got = _by_counter(await client.collect(), "srv")
        drops = _by_counter(await client.collect(), "")["prober_socket_drops"]
    finally:
        await client.close()
        peer.stop()
    assert during["probes_host_dropped"] > 0 and during["probes_lost"] == 0
    assert got["probes_lost"] == got["probes_late"] == 0
    assert got["probes_received"] + got["probes_host_dropped"] == got["probes_sent"]
    assert drops > 0 and got["probes_host_dropped"] >= drops  # every dropped reply's probe, and no fewer


async def test_a_stalled_prober_with_its_sized_queue_drops_nothing() -> None:
    """The same stall with the queue the collector sizes: every reply read late, none dropped."""
    peer, client = _peer_and_prober(rate_per_second=200)
    try:
        await client.collect()
        await asyncio.sleep(0.3)
        time.sleep(2 * TIMEOUT_SECONDS)  # noqa: ASYNC251 - as above
        client.stop_probing()
        await asyncio.sleep(3 * TIMEOUT_SECONDS)
        readings = await client.collect()
    finally:
        await client.close()
        peer.stop()
    got, node = _by_counter(readings, "srv"), _by_counter(readings, "")
    assert (got["probes_lost"], got["probes_host_dropped"], node["prober_socket_drops"]) == (0, 0, 0)
    assert got["probes_received"] == got["probes_sent"] > 0
