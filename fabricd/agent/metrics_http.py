"""The agent's ``/metrics`` over HTTP/1.1, served on the agent's own event loop.

prometheus_client's ``start_http_server`` (wsgiref, a thread per request, no keep-alive) cost more
CPU per scrape than rendering (measured: ~2 ms of the 11 ms of a scrape, docs/benchmarks.md). A
scraper needs little of HTTP: ``GET /metrics``, persistent connections (Prometheus keeps one per
target, RFC 9112 section 9.3) and gzip when it asks (Prometheus sends ``Accept-Encoding: gzip``).
So this is that much, as an ``asyncio.Protocol``: requests are parsed from the bytes received,
answered in order, and a request that is too large or malformed is answered 4xx and the connection
closed. ``page()`` runs on the loop, between scrapes of the collectors, so nothing is shared
across threads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

try:  # ISA-L's deflate: the same gzip at a sixth of zlib's CPU (0.05 ms vs 0.32 ms for 110 KB)
    from isal.isal_zlib import compress
except ImportError:  # a platform without its wheel: zlib, the same bytes on the wire format
    from zlib import compress

log = logging.getLogger("fabricd.agent.metrics")

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"  # the text format prometheus_client serves
MAX_REQUEST_BYTES = 16 * 1024  # a scraper's request is a few hundred bytes
# Level 1 (measured on the 8-HCA bench page, 110 KB: 8.9 KB with isal, 9.1 KB with zlib, whose
# level 6 costs six times more CPU for 6.6 KB). Compressing matters at fleet scale: 110 KB per node
# per scrape is ~70 MB/s into Prometheus for 10,000 nodes every 15 s; gzipped, ~6 MB/s.
GZIP_LEVEL = 1
LANDING = b"<html><body><a href='/metrics'>/metrics</a></body></html>\n"


class MetricsProtocol(asyncio.Protocol):
    """One client connection; ``page`` renders the exposition, once per ``GET /metrics``."""

    def __init__(self, page: Callable[[], bytes]) -> None:
        self.page = page
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None and not self.transport.is_closing():
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_REQUEST_BYTES:
                    self._reply(431, b"request header too large\n", close=True)
                return
            head, self.buffer = self.buffer[:end], self.buffer[end + 4 :]
            self._handle(head)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def _handle(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return self._reply(400, b"bad request line\n", close=True)
        method, target, version = parts
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                return self._reply(400, b"bad header line\n", close=True)
            headers[name.strip().lower()] = value.strip().lower()
        if headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers:
            return self._reply(400, b"requests with a body are not served\n", close=True)
        connection = headers.get(b"connection", b"")
        close = b"close" in connection if version == b"HTTP/1.1" else b"keep-alive" not in connection
        if method not in (b"GET", b"HEAD"):
            return self._reply(405, b"only GET and HEAD\n", close=close, extra=b"Allow: GET, HEAD\r\n")
        path = target.partition(b"?")[0]
        if path == b"/":
            return self._reply(200, LANDING, close=close, ctype=b"text/html", head_only=method == b"HEAD")
        if path != b"/metrics":
            return self._reply(404, b"not found: try /metrics\n", close=close)
        try:
            body = self.page()
        except Exception:  # a bug in rendering must not take the agent down; the scrape fails
            log.exception("cannot render /metrics")
            return self._reply(500, b"cannot render metrics; see the agent's log\n", close=close)
        extra = b""
        if b"gzip" in headers.get(b"accept-encoding", b""):
            body = compress(body, GZIP_LEVEL, wbits=31)  # wbits 31: the gzip container
            extra = b"Content-Encoding: gzip\r\n"
        return self._reply(200, body, close=close, ctype=CONTENT_TYPE, extra=extra, head_only=method == b"HEAD")

    def _reply(
        self,
        status: int,
        body: bytes,
        *,
        close: bool,
        ctype: bytes = b"text/plain; charset=utf-8",
        extra: bytes = b"",
        head_only: bool = False,
    ) -> None:
        if self.transport is None:
            return
        reason = _REASONS[status]
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
            status,
            reason,
            ctype,
            len(body),
            extra,
            b"Connection: close\r\n" if close else b"",
        )
        self.transport.write(head if head_only else head + body)
        if close:
            self.transport.close()


_REASONS = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
}


async def serve(host: str, port: int, page: Callable[[], bytes]) -> asyncio.Server:
    """Listen on ``host:port``; the caller closes the returned server. Raises OSError."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: MetricsProtocol(page), host or None, port, reuse_address=True)
