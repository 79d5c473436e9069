"""A small stand-in for the central's ingest endpoint, used by the transport's unit tests.

It follows the ingest contract (decode with ``fabricd.wire``, 200 ``{"batch_id", "accepted",
"duplicate"}``, a re-sent id acknowledged with ``duplicate: true`` and not stored twice) and can be
scripted to answer 429/503/5xx/4xx or to stall, and told which wire versions it reads (``reads``),
answering others as the real central does (422 ``unsupported_schema_version``), to stand for an
older or newer release during a rolling upgrade. It runs as a real uvicorn server on a free local
port (optionally TLS), in the test's event loop; stopping it makes the port refuse connections.
The acceptance tests use the real ``fabricd server`` instead (tests/test_agent_acceptance.py).
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response

from fabricd.model import Batch, Reading, Sample
from fabricd.wire import MSGPACK, SUPPORTED_VERSIONS, WireError, decode
from tests.helpers import need_binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Scripted:
    status: int
    body: str = "{}"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # stall before answering (a slow or restarting central)
    store: bool = False  # store the batch before answering (an acknowledgement that gets lost)


class CentralDouble:
    def __init__(self, port: int | None = None, certfile: Path | None = None, keyfile: Path | None = None) -> None:
        self.port = port or free_port()
        self.certfile, self.keyfile = certfile, keyfile
        self.batches: dict[str, Batch] = {}
        self.order: list[str] = []  # stored batch ids in arrival order
        self.requests: list[tuple[float, str, int]] = []  # (loop time, batch id, status answered)
        self.headers: list[dict[str, str]] = []
        self.peers: list[int] = []  # the client's port per request: one per connection it used
        self.script: list[Scripted] = []
        self.reads: tuple[int, ...] = SUPPORTED_VERSIONS  # wire versions this "release" decodes
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.certfile else 'http'}://127.0.0.1:{self.port}"

    def samples(self) -> int:
        return sum(len(b.samples) for b in self.batches.values())

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/api/v1/ingest")
        async def ingest(request: Request) -> Response:
            return await self._ingest(request)

        return app

    async def _ingest(self, request: Request) -> Response:
        body = await request.body()
        self.headers.append(dict(request.headers))
        self.peers.append(request.client.port if request.client else 0)
        try:
            batch = decode(
                body,
                request.headers.get("content-type", MSGPACK),
                gzipped=request.headers.get("content-encoding") == "gzip",
            )
        except WireError as exc:
            return self._answer(batch_id="", status=400, body=f'{{"detail": "{exc}"}}')
        if batch.schema_version not in self.reads:
            body = json.dumps(
                {"error": "unsupported_schema_version", "message": "...", "supported_versions": list(self.reads)}
            )
            return self._answer(batch.batch_id, 422, body)
        if self.script:
            step = self.script.pop(0)
            if step.store:
                self._store(batch)
            await asyncio.sleep(step.delay)
            if step.status != 200:
                return self._answer(batch.batch_id, step.status, step.body, step.headers)
        duplicate = not self._store(batch)
        text = f'{{"batch_id": "{batch.batch_id}", "accepted": {len(batch.samples)}, "duplicate": {str(duplicate).lower()}}}'
        return self._answer(batch.batch_id, 200, text)

    def _store(self, batch: Batch) -> bool:
        if batch.batch_id in self.batches:
            return False
        self.batches[batch.batch_id] = batch
        self.order.append(batch.batch_id)
        return True

    def _answer(self, batch_id: str, status: int, body: str, headers: dict[str, str] | None = None) -> Response:
        self.requests.append((asyncio.get_running_loop().time(), batch_id, status))
        return Response(body, status, headers=headers, media_type="application/json")

    async def start(self) -> None:
        config = uvicorn.Config(
            self.app(),
            host="127.0.0.1",
            port=self.port,
            log_config=None,
            log_level="warning",
            lifespan="off",
            ws="none",
            http="h11",
            access_log=False,
            ssl_certfile=str(self.certfile) if self.certfile else None,
            ssl_keyfile=str(self.keyfile) if self.keyfile else None,
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        for _ in range(500):
            if self._server.started or self._task.done():
                break
            await asyncio.sleep(0.01)
        if not self._server.started:
            raise RuntimeError(f"central double did not start on port {self.port}")

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        self._server = self._task = None


async def until(predicate: object, seconds: float = 20.0) -> None:
    """Wait (bounded) for ``predicate()`` to hold; fail with a clear message otherwise."""
    assert callable(predicate)
    for _ in range(int(seconds / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {seconds:g}s")


async def test_double_stores_a_resent_batch_once() -> None:
    from fabricd.wire import encode

    central = CentralDouble()
    await central.start()
    try:
        body = encode(Batch(node="n1", agent_version="t", batch_id="b1", samples=[], instance="i", seq=1))
        headers = {"content-type": MSGPACK, "content-encoding": "gzip"}
        async with httpx.AsyncClient() as client:
            first = await client.post(central.url + "/api/v1/ingest", content=body, headers=headers)
            again = await client.post(central.url + "/api/v1/ingest", content=body, headers=headers)
    finally:
        await central.stop()
    assert first.json()["duplicate"] is False
    assert again.json()["duplicate"] is True
    assert central.order == ["b1"]


def scrape(ts: float, ports: int = 4) -> list[Sample]:
    """One scrape's samples: an IB data counter per port, at event time ``ts``."""
    return [Sample(ts=ts, reading=_xmit_data(str(p), 4.0 * ts), rate=4.0) for p in range(1, ports + 1)]


def _xmit_data(port: str, value: float) -> Reading:
    return Reading(source="infiniband", device="mlx5_0", port=port, counter="port_xmit_data", value=value, unit="bytes")


def stored_timestamps(central: CentralDouble) -> list[float]:
    """Every stored sample's ts for port 1, sorted (duplicates would show up twice)."""
    return sorted(s.ts for b in central.batches.values() for s in b.samples if s.reading.port == "1")


@dataclass(frozen=True)
class Tls:
    ca: Path  # the CA that signed the server certificate
    cert: Path
    key: Path
    other_ca: Path  # a CA that did not sign it ("wrong CA")


def make_tls(folder: Path) -> Tls:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    openssl = need_binary("openssl")
    folder.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=folder)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]
    for name in ("ca", "other"):
        run(
            "req",
            "-x509",
            *ec,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-subj",
            f"/CN=fabricd test {name}",
            *ca_ext,
        )
    run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (folder / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\n"
    )
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    )
    return Tls(folder / "ca.pem", folder / "server.pem", folder / "server.key", folder / "other.pem")
