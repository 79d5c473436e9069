"""NCCL RAS status, asked: the protocol of NCCL's ``ncclras`` client (its report is parsed by
``fabricd/parsers/ras.py``).

NCCL (since 2.24.3) listens for RAS clients on ``localhost:28028``. The exchange, as
``src/ras/client.cc`` in NVIDIA/nccl does it: send ``CLIENT PROTOCOL <n>``, read ``SERVER PROTOCOL
<n>``, send ``STATUS``, read the report until the job closes the connection.

Polling RAS has crashed or corrupted jobs: 2.26.2 during communicator initialization
(NVIDIA/nccl#1669), 2.26.5 polled in a loop (#1718), 2.27.3 at 128 GPUs (#1762); 2.27.7 (#1996) and
2.29.7 (#2346) have RAS crashes of their own. So ``check_version`` refuses those and everything
before ``MIN_VERSION``; the ``ras`` collector is off unless configured, needs the jobs' NCCL
version stated, and polls at most every 5 minutes.
"""

from __future__ import annotations

import asyncio
import re

CLIENT_PROTOCOL = 2
MIN_VERSION = (2, 28, 3)  # the first NCCL with Inspector; every RAS crash report above is older or listed
REFUSED = {
    (2, 26, 2): "NVIDIA/nccl#1669",
    (2, 26, 5): "NVIDIA/nccl#1718",
    (2, 27, 3): "NVIDIA/nccl#1762",
    (2, 27, 7): "NVIDIA/nccl#1996",
    (2, 29, 7): "NVIDIA/nccl#2346",
}
MAX_REPORT_BYTES = 4 << 20
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def parse_version(text: str) -> tuple[int, int, int]:
    m = _VERSION.match(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not an NCCL version such as 2.28.9")
    major, minor, patch = (int(g) for g in m.groups())
    return major, minor, patch


def check_version(text: str) -> str:
    """The version if RAS may be polled on it; ValueError saying why not."""
    version = parse_version(text)
    if version in REFUSED:
        raise ValueError(f"NCCL {text}: polling RAS crashes or corrupts jobs on this version ({REFUSED[version]})")
    if version < MIN_VERSION:
        low = ".".join(map(str, MIN_VERSION))
        raise ValueError(f"NCCL {text}: RAS is polled only from {low} (older versions crashed when polled)")
    return text


async def ask_status(host: str, port: int, timeout_seconds: float) -> str:
    """One STATUS exchange with the job's RAS thread; the report as text."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_seconds)
    try:
        writer.write(f"CLIENT PROTOCOL {CLIENT_PROTOCOL}\n".encode())
        await writer.drain()
        hello = await asyncio.wait_for(reader.readline(), timeout_seconds)
        if not hello.upper().startswith(b"SERVER PROTOCOL "):
            raise ValueError(f"not an NCCL RAS service: it answered {hello[:80]!r}")
        writer.write(b"STATUS\n")
        await writer.drain()
        chunks, size = [], 0
        while size < MAX_REPORT_BYTES:  # the report ends when NCCL closes the connection
            chunk = await asyncio.wait_for(reader.read(65536), timeout_seconds)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks).decode(errors="replace")
    finally:
        writer.close()
