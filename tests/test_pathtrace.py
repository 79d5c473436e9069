"""Path discovery by the agents (issue 16 §4): a UDP traceroute with the probe's own 5-tuple, on a
routed leaf-spine of network namespaces with real ECMP. Checked against the fabric itself: the
probe's own packets are counted on the spine the trace named, and none on the other."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fabricd.pathtrace import Hop, IcmpError, hop_elements, parse_recverr, route_links, trace, trace_async
from tests.helpers import REPO, need_binary, need_root
from tests.support.lab import in_netns
from tests.support.routed_lab import SPINES, RoutedLab, routed_lab

DST_PORT = 33434  # the destination's probe responder (as pingmesh's): it echoes, the trace ends there
SRC_PORTS = range(40000, 40016)
PACKETS = 40


def test_an_icmp_error_names_its_origin_type_and_offender() -> None:
    # struct sock_extended_err (errno 113, origin ICMP, type 11, code 0) + sockaddr_in 10.12.0.2
    data = struct.pack("=IBBBBII", 113, 2, 11, 0, 0, 0, 0) + struct.pack(
        "=HH4s", socket.AF_INET, 0, bytes([10, 12, 0, 2])
    )
    assert parse_recverr(data) == IcmpError(2, 11, 0, "10.12.0.2")
    assert parse_recverr(data[:16]) == IcmpError(2, 11, 0, None)
    assert parse_recverr(b"short") is None


async def test_a_reply_arriving_during_a_trace_is_handed_on_by_the_loops_reader_not_the_woken_trace() -> None:
    # The prober's replies reach the trace socket while its pair is traced (same 5-tuple). Handed on
    # by the trace task once woken, each waited one more loop iteration: on the live demo's loaded
    # machine the traced pairs' fastest probes rose ~100 us and opened a congestion incident. In the
    # reader callback (no task running) they are as prompt as on the prober's own socket.
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # the destination: never answers
    silent.bind(("127.0.0.1", 0))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # the responder of the prober's probes
    handed: list[tuple[bytes, Any, float]] = []

    def passer(data: bytes, _addr: Any) -> None:
        handed.append((data, asyncio.current_task(), time.monotonic()))

    try:
        tracing = asyncio.create_task(
            trace_async(
                sock,
                silent.getsockname(),
                max_hops=1,
                timeout_s=1.0,
                attempts=1,
                answer=lambda *_: False,
                passer=passer,
            )
        )
        await asyncio.sleep(0.2)  # the trace waits for its first hop
        sent = time.monotonic()
        peer.sendto(b"reply", sock.getsockname())
        hops = await tracing
    finally:
        for s in (silent, sock, peer):
            s.close()
    assert hops == [Hop(1, None)]
    ((data, task, at),) = handed
    assert (data, task) == (b"reply", None)  # from the loop's reader callback, no task
    assert at - sent < 0.5  # while the trace still waited (its 1 s timeout), not after it


@pytest.fixture(scope="module")
def lab() -> Iterator[RoutedLab]:
    need_root()
    need_binary("ip")
    with routed_lab(f"fdpt{os.getpid() % 1000}") as built:
        sock = in_netns(built.ns("gpu-b1"), lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        sock.bind((built.address("gpu-b1"), DST_PORT))  # a socket stays in the namespace it was made in
        sock.settimeout(0.2)
        stop = threading.Event()
        responder = threading.Thread(target=_echo, args=(sock, stop), name="responder")
        responder.start()
        try:
            yield built
        finally:
            stop.set()
            responder.join(timeout=5)
            sock.close()


def _echo(sock: socket.socket, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            data, addr = sock.recvfrom(2048)
        except TimeoutError:
            continue
        sock.sendto(data, addr)


def _trace_and_count(lab: RoutedLab, sport: int) -> tuple[list[Hop], dict[str, int]]:
    """Trace from gpu-a1 with source port ``sport``, then send the probe's own packets on the same
    socket and count what each spine receives from rack1-leaf (its swp1)."""
    dst = (lab.address("gpu-b1"), DST_PORT)

    def run() -> tuple[list[Hop], int]:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind((lab.address("gpu-a1"), sport))
            hops = trace(sock, dst, max_hops=8, timeout_s=1.0)
            for _ in range(PACKETS):
                sock.sendto(b"probe", dst)
            sock.settimeout(1.0)
            with contextlib.suppress(TimeoutError):  # take the echoes: a closed port would answer ICMP
                for _ in range(PACKETS):
                    sock.recvfrom(2048)
            return hops, sport

    before = {s: lab.rx_packets(s, "swp1") for s in SPINES}
    hops, _ = in_netns(lab.ns("gpu-a1"), run)
    after = {s: lab.rx_packets(s, "swp1") for s in SPINES}
    return hops, {s: after[s] - before[s] for s in SPINES}


@pytest.mark.root
@pytest.mark.slow
def test_each_probe_is_traced_on_the_spine_its_own_packets_cross(lab: RoutedLab) -> None:
    owners, topo = lab.owners(), lab.topology()
    spines_used = set()
    for sport in SRC_PORTS:
        hops, received = _trace_and_count(lab, sport)
        elements = hop_elements(hops, owners)
        assert [h.reached for h in hops] == [False, False, False, True], hops
        assert elements[0] == "rack1-leaf" and elements[2:] == ["rack2-leaf", "gpu-b1"]
        spine = elements[1]
        assert spine in SPINES
        # The probe's own packets (same 5-tuple) all went through that spine, none through the other.
        other = next(s for s in SPINES if s != spine)
        # (and the trace's: TTL 2 expires at the spine, 3 and 4 cross it; a hop asked twice, more)
        assert (received[spine] >= PACKETS + 3, received[other]) == (True, 0), (sport, received)
        assert route_links(topo, "gpu-a1/eth0", "gpu-b1/eth0", elements) == [
            "gpu-a1/eth0~rack1-leaf",
            f"rack1-leaf~{spine}",
            f"rack2-leaf~{spine}",
            "gpu-b1/eth0~rack2-leaf",
        ]
        spines_used.add(spine)
    assert spines_used == set(SPINES)  # real ECMP: the source port moves flows between spines


@pytest.mark.root
@pytest.mark.slow
def test_the_cli_traces_a_five_tuple(lab: RoutedLab) -> None:
    argv = ["ip", "netns", "exec", lab.ns("gpu-a1"), sys.executable, "-m", "fabricd", "topology", "trace"]
    argv += [lab.address("gpu-b1"), "--dst-port", str(DST_PORT), "--src-port", "40003", "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    hops, _ = _trace_and_count(lab, 40003)
    assert (doc["src_port"], [h["address"] for h in doc["hops"]]) == (40003, [h.address for h in hops])
    assert doc["hops"][-1]["reached"] is True


def test_a_path_the_topology_cannot_explain_is_no_route() -> None:
    topo = RoutedLab("x").topology()
    assert route_links(topo, "gpu-a1/eth0", "gpu-b1/eth0", ["rack1-leaf", None, "rack2-leaf", "gpu-b1"]) is None
    assert route_links(topo, "gpu-a1/eth0", "gpu-b1/eth0", ["rack1-leaf", "rack2-leaf", "gpu-b1"]) is None
