"""Helpers for tests and benchmarks of the central service: batches, a real server process, PostgreSQL.

Real parts, not mocks: ``ServerProcess`` runs ``python -m fabricd server`` on a free port, and
``pg_schema`` gives each test its own schema on a real PostgreSQL server.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
from fastapi import FastAPI

from fabricd import wire
from fabricd.model import Batch, CollectorHealth, Kind, Reading, Sample, Status

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from fabricd.server.store.storage import Storage

PG_ADMIN_URL = os.environ.get("FABRICD_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def ib_sample(
    ts: float,
    device: str = "mlx5_0",
    port: str = "1",
    counter: str = "port_xmit_data",
    name: str = "port_transmit_data",
    value: float = 4096.0,
    rate: float | None = 1e9,
    unit: str = "bytes",
    kind: Kind = Kind.COUNTER,
    labels: Sequence[tuple[str, str]] = (),
) -> Sample:
    r = Reading("infiniband", device, port, counter, value, unit, kind, tuple(labels), name)
    return Sample(ts=ts, reading=r, rate=rate, status=Status.OK if rate is not None else Status.FIRST)


def make_batch(node: str, batch_id: str, samples: list[Sample], ts: float | None = None, seq: int = 1) -> Batch:
    now = ts if ts is not None else time.time()
    health = [CollectorHealth("infiniband", True, 0.004, now, "", len(samples))]
    return Batch(
        node=node,
        agent_version="0.1.0",
        batch_id=batch_id,
        samples=samples,
        health=health,
        created_ts=now,
        instance="test-instance",
        seq=seq,
    )


def encoded(batch: Batch, content_type: str = wire.MSGPACK, gzip: bool = True) -> tuple[bytes, dict[str, str]]:
    headers = {"Content-Type": content_type}
    if gzip:
        headers["Content-Encoding"] = "gzip"
    return wire.encode(batch, content_type, compress=gzip), headers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``python -m fabricd server`` in a subprocess, ready when /readyz says so."""

    def __init__(
        self,
        data_dir: Path,
        db: str | None = None,
        auth: bool = True,
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",  # 0.0.0.0: also reachable from network namespaces (the routed lab)
    ) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable,
            "-m",
            "fabricd",
            "server",
            "--listen",
            f"{host}:{self.port}",
            "--data-dir",
            str(data_dir),
            *(["--db", db] if db else []),
            *([] if auth else ["--no-auth"]),
            *extra,
        ]
        self.env = {**os.environ, **(env or {})}
        self.log = data_dir / f"server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout}s: {self.log.read_text()[-3000:]}")

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        code = self.proc.returncode
        self.proc = None
        return code


def pg_reachable() -> bool:
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(PG_ADMIN_URL)
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
        engine.dispose()
        return True
    except Exception:
        return False


@contextlib.contextmanager
def pg_schema() -> Iterator[str]:
    """A fresh schema on the test PostgreSQL; yields a URL whose search_path points at it; dropped after."""
    import sqlalchemy

    name = f"fabricd_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f'CREATE SCHEMA "{name}"'))
    try:
        yield f"{PG_ADMIN_URL}?options={quote(f'-csearch_path={name}')}"
    finally:
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f'DROP SCHEMA "{name}" CASCADE'))
        admin.dispose()


@contextlib.contextmanager
def pg_engine() -> Iterator[Engine]:
    """An engine on a fresh schema of the test PostgreSQL (``pg_schema``), disposed after."""
    from fabricd.server import db

    with pg_schema() as url:
        engine = db.make_engine(url)
        try:
            yield engine
        finally:
            engine.dispose()


@contextlib.contextmanager
def sqlite_storage(path: Path) -> Iterator[Storage]:
    """The central's store on a migrated SQLite file at ``path``, disposed after."""
    from fabricd.server import db
    from fabricd.server.store.storage import Storage

    engine = db.make_engine(f"sqlite:///{path}")
    db.prepare(engine)
    try:
        yield Storage.open(engine)
    finally:
        engine.dispose()


@contextlib.contextmanager
def backend_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A database URL for ``backend`` (``sqlite`` in ``tmp_path`` or ``postgres`` in a fresh schema)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'data' / 'fabricd.db'}"
        return
    with pg_schema() as url:
        yield url


@contextlib.asynccontextmanager
async def running(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan (migrations, loops) and give an HTTP client talking to it in-process."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fabricd.test") as client:
            yield client


class Heard:
    """A writer listener (``GroupCommitWriter.subscribe``): every ``Committed`` it was handed."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def committed(self, batches: Sequence[Any]) -> None:
        self.batches.extend(batches)
