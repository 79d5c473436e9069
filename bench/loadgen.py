"""A lean HTTP/1.1 load generator for the ingest rows: pre-built requests on kept-alive connections.

In a fleet the agents encode and post their batches on their own nodes; in the bench they share
the central's 2 cores. httpx spent 4.8 µs of CPU a sample posting 480-sample batches (the
``load generator CPU per sample`` row at `7245c27`), about a core at the 200,000 samples/s issue 18
asks of the central, which left the server the other core only. This client writes each request as
one pre-built byte string (request line, headers, body) on ``concurrency`` connections and reads
the answer's status line, headers and body, nothing more: its own CPU is small beside the server's
(the ``load generator CPU per sample`` row measures it), so the rows measure the server.

It speaks only what ``fabricd server`` answers with (uvicorn: ``Content-Length`` bodies, no
chunked responses); 429 and 503 are retried after ``Retry-After`` as the agent does, any other
status that is not 200 is an error.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

HEADERS_END = b"\r\n\r\n"


def request_bytes(host: str, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/msgpack\r\n"
        f"Content-Encoding: gzip\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(HEADERS_END)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def _post_all(url: str, bodies: list[bytes], concurrency: int) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    queue: list[bytes] = [request_bytes(parts.netloc, "/api/v1/ingest", b) for b in reversed(bodies)]

    async def agent() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while queue:
                request = queue.pop()
                while True:
                    writer.write(request)
                    status, headers, body = await _answer(reader)
                    if status == 200:
                        break
                    if status not in (429, 503):
                        raise RuntimeError(f"ingest answered {status}: {body[:300]!r}")
                    await asyncio.sleep(float(headers.get("retry-after", "0.2")))
        finally:
            writer.close()

    await asyncio.gather(*(agent() for _ in range(concurrency)))


def post_all(url: str, bodies: list[bytes], concurrency: int = 8) -> float:
    """POST every body (gzipped msgpack batches) with ``concurrency`` connections; wall seconds."""
    start = time.perf_counter()
    asyncio.run(_post_all(url, bodies, concurrency))
    return time.perf_counter() - start
