"""Idle connections between agents and the central: the agent gives them up before the central does.

httpx and uvicorn both default to 5 s. An agent sending every 5 s reused its connection just as the
central closed it, and the send failed (ReadError, resent 0.4 s later). The agent now keeps an idle
connection ``transport.keepalive_seconds`` (55 s), the central ``keepalive_timeout_seconds`` (75 s).
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

from fabricd.settings import ServerSettings, TransportSettings
from fabricd.transport.sender import HttpxPoster
from fabricd.wire import MSGPACK, encode
from tests.support.server import ServerProcess, make_batch
from tests.test_transport_central_double import CentralDouble, scrape

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: fabricd\r\n\r\n"


def test_the_agent_gives_up_an_idle_connection_before_the_central_does() -> None:
    assert TransportSettings().keepalive_seconds < ServerSettings().keepalive_timeout_seconds
    assert ServerSettings().keepalive_timeout_seconds > 60  # over the longest usual agent interval


def _answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"the central closed the connection mid-answer: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
    while len(rest) < length:
        rest += sock.recv(4096)
    return head.split(b"\r\n", 1)[0]


def test_the_central_closes_an_idle_connection_after_its_keepalive_timeout(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, auth=False, env={"FABRICD_KEEPALIVE_TIMEOUT_SECONDS": "2"}).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(REQUEST)
            assert _answer(sock) == b"HTTP/1.1 200 OK"
            time.sleep(1.0)  # idle for half the timeout: the connection is still served
            sock.sendall(REQUEST)
            assert _answer(sock) == b"HTTP/1.1 200 OK"
            answered = time.monotonic()
            assert sock.recv(1) == b""  # the central closes it ...
            idle = time.monotonic() - answered
    finally:
        server.stop()
    assert 1.5 < idle < 4.5, idle  # ... after its 2 s, not uvicorn's default 5 s


async def _post_twice(poster: HttpxPoster, central: CentralDouble, pause: float) -> None:
    await _post(poster, central, 1)
    await asyncio.sleep(pause)
    await _post(poster, central, 2)


async def _post(poster: HttpxPoster, central: CentralDouble, seq: int) -> None:
    body = encode(make_batch("node-a", f"keepalive-{seq}", scrape(time.time()), seq=seq), MSGPACK, compress=True)
    result = await poster.post(
        f"{central.url}/api/v1/ingest", body, {"Content-Type": MSGPACK, "Content-Encoding": "gzip"}
    )
    assert result.status == 200, result


async def test_an_idle_connection_is_reused_within_the_agents_keepalive_and_not_after() -> None:
    central = CentralDouble()
    await central.start()
    try:
        kept = HttpxPoster(TransportSettings(keepalive_seconds=3.0))
        await _post_twice(kept, central, pause=0.5)
        await kept.aclose()
        dropped = HttpxPoster(TransportSettings(keepalive_seconds=0.2))
        await _post_twice(dropped, central, pause=0.6)
        await dropped.aclose()
    finally:
        await central.stop()
    first, second, third, fourth = central.peers
    assert first == second  # idle 0.5 s < 3 s: the same connection
    assert third != fourth  # idle 0.6 s > 0.2 s: the agent opened a new one, and no send failed
