"""Pingmesh: the probe ledger's exact accounting, the wire format, and real UDP probes on loopback."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from collectors.pingmesh import PingmeshCollector, PingmeshFactories
from fabricd.collector import CollectorConfigError, build
from fabricd.model import Kind, Reading
from fabricd.probe import (
    REPLY,
    REQUEST,
    Probe,
    ProberProtocol,
    ResponderProtocol,
    Shape,
    Target,
    decode,
    drop_every,
    encode,
    reply_to,
)
from fabricd.probe_ledger import Ledger

REGISTRY = {"pingmesh": "collectors.pingmesh:PingmeshCollector"}
MS = 1_000_000


def _mesh(options: Mapping[str, Any], factories: PingmeshFactories | None = None) -> PingmeshCollector:
    collector = build(
        "pingmesh",
        dict(options),
        node="n1",
        sysfs_root=Path("/sys"),
        registry=REGISTRY,
        factories=[factories] if factories else [],
    )
    assert isinstance(collector, PingmeshCollector)
    return collector


def _by_counter(readings: list[Reading] | Any, peer: str) -> dict[str, float]:
    return {r.counter: r.value for r in readings if r.device == peer}


# --- the ledger (pure) --------------------------------------------------------------------------


def test_timeouts_are_loss_and_late_replies_are_not_counted_twice() -> None:
    ledger = Ledger(timeout_ns=100 * MS)
    for seq in range(5):
        ledger.on_send(seq, seq * MS)
    ledger.on_reply(0, 10 * MS)
    ledger.on_reply(2, 12 * MS)
    ledger.expire(150 * MS)  # 1, 3, 4 time out
    ledger.on_reply(3, 160 * MS)  # late: already lost
    ledger.on_reply(3, 161 * MS)  # the same late reply duplicated
    ledger.on_reply(0, 162 * MS)  # duplicate of a received one
    c = ledger.counts()
    assert (c.sent, c.received, c.lost, c.late, c.duplicate, c.in_flight) == (5, 2, 3, 1, 2, 0)
    assert c.received + c.lost == c.sent


def test_out_of_order_replies_are_counted_and_still_received() -> None:
    ledger = Ledger(timeout_ns=1000 * MS)
    for seq in range(4):
        ledger.on_send(seq, 0)
    for seq in (0, 2, 1, 3):
        ledger.on_reply(seq, 5 * MS)
    assert (ledger.counts().received, ledger.counts().out_of_order) == (4, 1)


def test_rtt_summary_covers_one_interval() -> None:
    ledger = Ledger(timeout_ns=1000 * MS)
    for seq, rtt_ms in enumerate([1, 2, 3, 4, 100]):
        ledger.on_send(seq, 0)
        ledger.on_reply(seq, rtt_ms * MS)
    rtt = ledger.take_rtt()
    assert rtt is not None
    assert (rtt.count, rtt.min, rtt.max) == (5, 0.001, 0.1)
    # Quantiles come from an HDR histogram with HIST_DIGITS=2 significant digits: within 1 %.
    assert rtt.p50 == pytest.approx(0.003, rel=1e-2) and rtt.p99 == pytest.approx(0.1, rel=1e-2)
    assert ledger.take_rtt() is None  # a new interval with no replies has no RTT


def test_rtt_quantiles_never_exceed_the_exact_max() -> None:
    """1340.926 us lands in the 1336-1343 us bucket, whose highest value the histogram answers."""
    ledger = Ledger(timeout_ns=1000 * MS)
    for seq in range(10):
        ledger.on_send(seq, 0)
        ledger.on_reply(seq, 1_340_926 if seq == 9 else 1_000_000 + seq * 1_000)
    rtt = ledger.take_rtt()
    assert rtt is not None
    assert rtt.max == 0.001340926 and rtt.p99 == rtt.max
    assert rtt.min == 0.001 <= rtt.p50 <= rtt.p90 <= rtt.p99


# --- wire format --------------------------------------------------------------------------------


def test_probe_round_trips_and_rejects_foreign_datagrams() -> None:
    probe = Probe(REQUEST, session=7, seq=2**40, send_ns=123456789, pad_len=100)
    data = encode(probe)
    assert len(data) == 28 + 100 and decode(data) == probe
    assert decode(reply_to(probe)) == Probe(REPLY, 7, 2**40, 123456789, 100)
    assert decode(b"GET / HTTP/1.1\r\n\r\n" * 3) is None
    assert decode(data[:20]) is None


def test_rocev2_probe_is_a_bth_that_scapy_reads() -> None:
    from scapy.contrib.roce import BTH

    data = encode(Probe(REQUEST, 1, 77, 5, shape=Shape.ROCEV2))
    bth = BTH(data)  # the oracle: scapy's own RoCE dissector
    assert (bth.opcode, bth.psn) == (0x64, 77)
    assert decode(data) == Probe(REQUEST, 1, 77, 5, shape=Shape.ROCEV2)


# --- real UDP on loopback -----------------------------------------------------------------------


class _DelayingResponder(ResponderProtocol):
    """Answers every ``k``-th probe only after ``delay`` seconds (past the prober's timeout)."""

    def __init__(self, k: int, delay: float) -> None:
        super().__init__()
        self.k, self.delay, self.seen, self.delayed = k, delay, 0, 0

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.seen += 1
        if self.seen % self.k:
            super().datagram_received(data, addr)
            return
        self.delayed += 1
        asyncio.get_running_loop().call_later(self.delay, super().datagram_received, data, addr)


class _EchoTwice(ResponderProtocol):
    def datagram_received(self, data: bytes, addr: Any) -> None:
        super().datagram_received(data, addr)
        super().datagram_received(data, addr)


async def _pair(responder: Callable[[], ResponderProtocol], **prober: Any) -> tuple[PingmeshCollector, ...]:
    server = _mesh({"listen_address": "127.0.0.1", "listen_port": 0}, PingmeshFactories(responder=responder))
    await server.collect()
    peer = {"name": "srv", "address": "127.0.0.1", "port": server.listen_port, "rate_per_second": 200}
    client = _mesh({"peers": [peer], "respond": False, "timeout_seconds": 0.25, **prober})
    return server, client


async def _run_and_drain(client: PingmeshCollector, seconds: float, drain: float = 0.7) -> list[Reading]:
    await client.collect()
    await asyncio.sleep(seconds)
    client.stop_probing()
    await asyncio.sleep(drain)  # every probe is now answered or past its timeout and the settling after it
    return list(await client.collect())


async def test_dropped_replies_are_exactly_the_loss() -> None:
    responder = ResponderProtocol(drop_every(4))
    server, client = await _pair(lambda: responder)
    readings = await _run_and_drain(client, 0.6)
    await client.close()
    await server.close()
    got = _by_counter(readings, "srv")
    assert got["probes_sent"] >= 40
    assert got["probes_lost"] == got["probes_sent"] // 4  # exactly the replies the responder dropped
    assert got["probes_received"] + got["probes_lost"] == got["probes_sent"]
    assert (got["probes_late"], got["probes_out_of_order"]) == (0, 0)


async def test_late_replies_count_as_loss_once_and_as_late() -> None:
    responder = _DelayingResponder(k=5, delay=0.5)
    server, client = await _pair(lambda: responder)
    readings = await _run_and_drain(client, 0.5, drain=0.8)
    await client.close()
    await server.close()
    got = _by_counter(readings, "srv")
    assert responder.delayed >= 10
    assert got["probes_lost"] == responder.delayed == got["probes_late"]
    assert got["probes_received"] == got["probes_sent"] - responder.delayed


# Tests that expect every probe answered give the replies 2 s: the responder runs on the test's own
# event loop, and a CI host busy with other suites starved that loop (8 probes sent in 0.3 s where
# 60 were due) long enough that one reply left it later than the 0.25 s default timeout.
PATIENT = 2.0


async def test_duplicated_replies_are_ignored() -> None:
    server, client = await _pair(_EchoTwice, timeout_seconds=PATIENT)
    readings = await _run_and_drain(client, 0.3, drain=PATIENT + 0.2)
    await client.close()
    await server.close()
    got = _by_counter(readings, "srv")
    assert got["probes_received"] == got["probes_sent"] > 0 and got["probes_lost"] == 0


async def test_rtt_gauges_and_counter_kinds() -> None:
    server, client = await _pair(ResponderProtocol, shape="rocev2", payload_bytes=64, timeout_seconds=PATIENT)
    readings = await _run_and_drain(client, 0.3, drain=PATIENT + 0.2)
    await client.close()
    await server.close()
    kinds = {r.counter: (r.kind, r.unit) for r in readings}
    assert kinds["probes_sent"] == (Kind.COUNTER, "probes")
    assert kinds["rtt_p99"] == (Kind.GAUGE, "seconds")
    got = _by_counter(readings, "srv")
    assert got["probes_received"] == got["probes_sent"] > 0  # BTH-wrapped probes are answered too
    assert 0 < got["rtt_min"] <= got["rtt_p50"] <= got["rtt_p90"] <= got["rtt_p99"] <= got["rtt_max"]


async def test_dscp_marks_probe_and_reply_sockets() -> None:
    server, client = await _pair(ResponderProtocol, dscp=26)
    await client.collect()
    sock = client.transports[0].get_extra_info("socket")
    tos = sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS)
    await client.close()
    await server.close()
    assert tos == 26 << 2  # AF41 in the upper six bits of the TOS byte


def test_options_are_validated_at_load() -> None:
    with pytest.raises(CollectorConfigError, match=r"collectors\.pingmesh\.peers\.0\.address"):
        _mesh({"peers": [{"name": "a", "address": "not-an-ip"}]})
    with pytest.raises(CollectorConfigError, match="unique"):
        _mesh({"peers": [{"name": "a", "address": "10.0.0.1"}, {"name": "a", "address": "10.0.0.2"}]})


async def test_an_answering_agent_reports_when_its_responder_started_and_a_restart_a_later_one() -> None:
    """``responder_start_time`` (device empty): when the responder began answering, the same every
    scrape; a new collector (the agent restarted) reports its own. A prober that does not answer
    reports none."""
    starts = []
    for _ in range(2):
        before = time.time()
        server, client = await _pair(ResponderProtocol)
        first = _by_counter(await server.collect(), "")
        second = _by_counter(await server.collect(), "")
        assert "responder_start_time" not in _by_counter(await client.collect(), "")
        await client.close()
        await server.close()
        assert first == second
        assert set(first) == {"responder_start_time", "responder_socket_drops", "responder_late_answers"}
        assert first["responder_socket_drops"] == first["responder_late_answers"] == 0
        assert before <= first["responder_start_time"] <= time.time()
        starts.append(first["responder_start_time"])
    assert starts[0] < starts[1]


async def test_a_probers_targets_are_probed_one_at_a_time_not_in_a_burst() -> None:
    """Four targets at 2 probes/s: each target's probes start a quarter interval after the
    previous target's, so the first round reaches them in order over 3/8 s (a burst would reach
    them within a millisecond or two, each path's delay then depending on its place in it)."""
    loop = asyncio.get_running_loop()
    arrivals: list[tuple[float, int]] = []

    class _Sink(asyncio.DatagramProtocol):
        def __init__(self, index: int) -> None:
            self.index = index

        def datagram_received(self, data: bytes, addr: Any) -> None:
            arrivals.append((loop.time(), self.index))

    sinks = [await loop.create_datagram_endpoint(partial(_Sink, i), local_addr=("127.0.0.1", 0)) for i in range(4)]
    targets = [Target(f"t{i}", "127.0.0.1", t.get_extra_info("sockname")[1], 2.0) for i, (t, _) in enumerate(sinks)]
    prober, _ = await loop.create_datagram_endpoint(lambda: ProberProtocol(targets, 10**9), local_addr=("127.0.0.1", 0))
    await asyncio.sleep(0.9)
    prober.close()
    for transport, _ in sinks:
        transport.close()
    first = arrivals[:4]
    assert [index for _, index in first] == [0, 1, 2, 3]
    assert first[-1][0] - first[0][0] > 0.375 / 2  # spread over the interval, not a burst
    assert [index for _, index in arrivals[4:8]] == [0, 1, 2, 3]  # and so every round
