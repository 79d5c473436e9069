"""Agents publishing to NATS JetStream, the central consuming: real nats-server, real transport, real central.

The agent side is the real ``Transport`` (batcher, spool, retries) with ``NatsPoster``; the
central is the real app (SQLite) with its ``BusConsumer``. Counted per series in the store: every
sample an agent submitted is stored exactly once, across a NATS outage (the agent spools, as when
the central is down, and drains afterwards) and across retried publishes (``Nats-Msg-Id``).
The machine's NATS at 127.0.0.1:4222 serves the plain path; the outage runs on a nats-server of
the test's own (killed and restarted on the same port and store), never on the shared one.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from fabricd import wire
from fabricd.bus import BusNames
from fabricd.model import CollectorHealth
from fabricd.server.app import create_app
from fabricd.server.auth import Principal
from fabricd.server.errors import ApiError
from fabricd.server.forward import BusForwarder
from fabricd.server.ingest import Body, Ingestor
from fabricd.server.metrics import ServerMetrics
from fabricd.server.services import Services
from fabricd.settings import AgentSettings, BusSettings, LimitSettings, ServerSettings
from fabricd.transport import Transport
from fabricd.transport.nats_poster import NatsPoster
from tests.helpers import need_binary, skip_or_fail
from tests.support.points import raw_points_by_series
from tests.support.server import free_port, ib_sample, make_batch, running

SHARED = "nats://127.0.0.1:4222"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


class NatsServer:
    """A nats-server with JetStream of the test's own: stop() is an outage, start() the recovery."""

    def __init__(self, binary: str, store: Path) -> None:
        self.binary, self.store, self.port = binary, store, free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [self.binary, "-js", "-sd", str(self.store), "-a", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while not _reachable("127.0.0.1", self.port):
            assert time.monotonic() < deadline, "nats-server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # no goodbye to the clients: an outage, not a shutdown
        self.proc.wait(10)
        self.proc = None


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(need_binary("nats-server"), tmp_path / "jetstream")
    server.start()
    yield server
    if server.proc is not None:
        server.stop()


def bus_settings(url: str) -> BusSettings:
    return BusSettings(url=url, prefix=f"t{uuid.uuid4().hex[:12]}", partitions=4)


def agent_settings(tmp_path: Path, node: str, bus: BusSettings) -> AgentSettings:
    return AgentSettings.model_validate(
        {
            "node": node,
            "data_dir": tmp_path / node,
            "bus": bus.model_dump(),
            "transport": {"batch_max_seconds": 0.05, "backoff_initial_seconds": 0.05, "backoff_max_seconds": 0.3},
        }
    )


async def agent(tmp_path: Path, node: str, bus: BusSettings) -> Transport:
    settings = agent_settings(tmp_path, node, bus)
    transport = Transport(
        settings,
        agent_version="test",
        poster_factory=lambda t: NatsPoster(settings.bus, node, t.timeout_seconds),
    )
    await transport.start()
    return transport


async def scrape(transport: Transport, ts: float, ports: int = 3) -> None:
    samples = [ib_sample(ts, device=f"mlx5_{p}", value=ts, rate=1.0) for p in range(ports)]
    await transport.submit(samples, [CollectorHealth("infiniband", True, 0.004, ts)])


def stored(svc: Services) -> Counter[tuple[str, str, float]]:
    """(node, device, event time) of every stored point, counted."""
    out: Counter[tuple[str, str, float]] = Counter()
    for s in svc.store.inventory.find_series(limit=10_000):
        for p in svc.store.inventory.points(s.id, 0, 1e12):
            out[(s.node, s.reading.device, p.ts)] += 1
    return out


async def until(check: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.fixture
async def central(tmp_path: Path) -> AsyncIterator[Callable[[BusSettings], Any]]:
    stack: list[Any] = []

    async def start(bus: BusSettings) -> Services:
        app = create_app(ServerSettings(data_dir=tmp_path / "central", auth=False, bus=bus.model_dump()))
        ctx = running(app)
        await ctx.__aenter__()
        stack.append(ctx)
        return app.state.services  # type: ignore[no-any-return]

    yield start
    for ctx in reversed(stack):
        await ctx.__aexit__(None, None, None)


async def test_batches_published_to_the_shared_nats_are_stored_once(tmp_path: Path, central: Any) -> None:
    if not _reachable("127.0.0.1", 4222):
        skip_or_fail("NATS JetStream at 127.0.0.1:4222 is not running (.ci/run starts it)")
    bus = bus_settings(SHARED)
    svc = await central(bus)
    agents = [await agent(tmp_path, f"node-{i}", bus) for i in range(3)]
    t0 = time.time()
    for k in range(4):
        for a in agents:
            await scrape(a, t0 + k)
            await asyncio.sleep(0.06)
    for a in agents:
        await a.close()
    expected = Counter({(f"node-{i}", f"mlx5_{p}", t0 + k): 1 for i in range(3) for p in range(3) for k in range(4)})
    await until(lambda: stored(svc) == expected)
    sent = [a.registry.get_sample_value("fabricd_agent_batches_sent_total") for a in agents]
    assert svc.bus.stored == sum(v or 0.0 for v in sent)


async def test_no_sample_is_lost_or_stored_twice_across_a_nats_outage(
    tmp_path: Path, own_nats: NatsServer, central: Any
) -> None:
    bus = bus_settings(own_nats.url)
    svc = await central(bus)
    a = await agent(tmp_path, "node-a", bus)
    t0 = time.time()
    for k in range(3):
        await scrape(a, t0 + k)
        await asyncio.sleep(0.06)
    await until(lambda: len(stored(svc)) == 9)
    own_nats.stop()  # the outage: the agent keeps scraping, and spools
    for k in range(3, 8):
        await scrape(a, t0 + k)
        await asyncio.sleep(0.06)
    await until(lambda: len(a.spool) >= 1)
    assert len(stored(svc)) == 9
    own_nats.start()  # recovery: the spool drains, the central reconnects and consumes
    expected = Counter({("node-a", f"mlx5_{p}", t0 + k): 1 for p in range(3) for k in range(8)})
    await until(lambda: stored(svc) == expected, 60)
    await until(lambda: len(a.spool) == 0)
    await a.close()
    assert stored(svc) == expected


async def test_a_retried_publish_is_a_duplicate_and_stored_once(
    tmp_path: Path, own_nats: NatsServer, central: Any
) -> None:
    from fabricd import wire
    from tests.support.server import make_batch

    bus = bus_settings(own_nats.url)
    svc = await central(bus)
    poster = NatsPoster(bus, "node-d", 5.0)
    batch = make_batch("node-d", "batch-1", [ib_sample(time.time())])
    body = wire.encode(batch, wire.MSGPACK, compress=True)
    headers = {"Content-Type": wire.MSGPACK, "Content-Encoding": "gzip", "X-Fabricd-Batch-Id": "batch-1"}
    first = await _publish_when_stream_exists(poster, body, headers)
    again = await poster.post("", body, headers)
    await poster.aclose()
    assert (first.status, first.text.startswith('{"duplicate": false')) == (200, True)
    assert (again.status, again.text.startswith('{"duplicate": true')) == (200, True)
    await until(lambda: svc.bus.stored == 1)
    await asyncio.sleep(0.3)
    assert sum(stored(svc).values()) == 1
    assert BusNames(bus.prefix, bus.partitions).subject("node-d") == poster.subject


async def _publish_when_stream_exists(poster: NatsPoster, body: bytes, headers: dict[str, str]) -> Any:
    from fabricd.transport.sender import PostError

    deadline = time.monotonic() + 15
    while True:
        try:
            return await poster.post("", body, headers)
        except PostError:  # no stream yet: the central creates it when it connects
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)


async def test_a_bad_message_is_refused_counted_and_the_next_ones_stored(
    tmp_path: Path, own_nats: NatsServer, central: Any
) -> None:
    from fabricd import wire
    from tests.support.server import make_batch

    bus = bus_settings(own_nats.url)
    svc = await central(bus)
    poster = NatsPoster(bus, "node-e", 5.0)
    bad = {"Content-Type": wire.MSGPACK, "X-Fabricd-Batch-Id": "bad-1"}
    await _publish_when_stream_exists(poster, b"not msgpack at all", bad)
    good = make_batch("node-e", "good-1", [ib_sample(time.time())])
    headers = {"Content-Type": wire.JSON, "X-Fabricd-Batch-Id": "good-1"}
    await poster.post("", wire.encode(good, wire.JSON, compress=False), headers)
    await poster.aclose()
    await until(lambda: svc.bus.stored == 1)
    assert sum(stored(svc).values()) == 1
    rejected = svc.registry.get_sample_value("fabricd_ingest_rejected_batches_total", {"reason": "bad_body"})
    assert rejected == 1.0


async def test_with_nats_down_the_central_ingests_over_http_and_stops_cleanly(tmp_path: Path) -> None:
    from tests.support.server import encoded, make_batch

    bus = bus_settings(f"nats://127.0.0.1:{free_port()}")  # nothing listens there
    app = create_app(ServerSettings(data_dir=tmp_path / "central", auth=False, bus=bus.model_dump()))
    started = time.monotonic()
    async with running(app) as client:
        body, headers = encoded(make_batch("node-h", "h1", [ib_sample(time.time())]))
        resp = await client.post("/api/v1/ingest", content=body, headers=headers)
        assert resp.status_code == 200, resp.text
        await asyncio.sleep(1.5)  # the consumer retries meanwhile
        assert sum(stored(app.state.services).values()) == 1
    assert time.monotonic() - started < 30  # the consumer's retry loop does not hold up the shutdown


async def test_the_central_stops_cleanly_after_nats_went_away(tmp_path: Path, own_nats: NatsServer) -> None:
    bus = bus_settings(own_nats.url)
    app = create_app(ServerSettings(data_dir=tmp_path / "central", auth=False, bus=bus.model_dump()))
    async with running(app):
        poster = NatsPoster(bus, "node-s", 5.0)
        from fabricd import wire
        from tests.support.server import make_batch

        body = wire.encode(make_batch("node-s", "s1", [ib_sample(time.time())]), wire.JSON, compress=False)
        await _publish_when_stream_exists(poster, body, {"Content-Type": wire.JSON, "X-Fabricd-Batch-Id": "s1"})
        await poster.aclose()
        await until(lambda: app.state.services.bus.stored == 1)
        own_nats.stop()
        await asyncio.sleep(1.5)
        started = time.monotonic()
    assert time.monotonic() - started < 15


async def test_a_batch_a_replica_forwards_is_counted_stored_once_across_the_replicas(
    tmp_path: Path, central: Any
) -> None:
    # A replica's HTTP ingest publishes to the bus (the real BusForwarder); the partition's owner (a
    # central consuming the bus) stores it. Summed over the two, fabricd_ingest_batches_total is 1:
    # the forwarding side counts it as forwarded (before: as stored too, twice in all).
    if not _reachable("127.0.0.1", 4222):
        skip_or_fail("NATS JetStream at 127.0.0.1:4222 is not reachable")
    bus = bus_settings(SHARED)
    owner = await central(bus)
    forwarder = BusForwarder(bus)
    await forwarder.start()
    edge = CollectorRegistry()
    ingestor = Ingestor(forwarder, LimitSettings(), ServerMetrics(edge), forwards=True)
    body = Body(wire.encode(make_batch("node-1", "b-1", [ib_sample(time.time())])), wire.MSGPACK, True)
    agent = Principal("agent", "node-1", "t")
    try:
        deadline = time.monotonic() + 30
        while True:  # 503 until the owner's consumer has created the stream; an agent retries too
            try:
                await anyio.to_thread.run_sync(ingestor.ingest_body, agent, body)
                break
            except ApiError as exc:
                assert exc.status == 503 and time.monotonic() < deadline, exc
                await asyncio.sleep(0.2)
        await anyio.to_thread.run_sync(ingestor.ingest_body, agent, body)  # a retry: JetStream says duplicate
        # The owner counts a batch after storing it: wait for both (the points show up first).
        await until(
            lambda: (
                sum(stored(owner).values()) == 1
                and (owner.registry.get_sample_value("fabricd_ingest_batches_total") or 0.0) >= 1
            )
        )
    finally:
        await forwarder.aclose()
    counted = {
        name: (edge.get_sample_value(name), owner.registry.get_sample_value(name))
        for name in (
            "fabricd_ingest_batches_total",
            "fabricd_ingest_forwarded_batches_total",
            "fabricd_ingest_duplicate_batches_total",
        )
    }
    assert counted == {
        "fabricd_ingest_batches_total": (0.0, 1.0),
        "fabricd_ingest_forwarded_batches_total": (1.0, 0.0),
        "fabricd_ingest_duplicate_batches_total": (1.0, 0.0),
    }


async def test_a_fetch_is_stored_at_once_across_nodes_and_in_order_within_each(tmp_path: Path, central: Any) -> None:
    """The consumer stores a fetch's batches of different nodes concurrently (the writer's group
    commit then takes them in few transactions) and each node's batches in the order published:
    counted per node, every point once, and a node's points in the table in event-time order."""
    if not _reachable("127.0.0.1", 4222):
        skip_or_fail("NATS JetStream at 127.0.0.1:4222 is not running (.ci/run starts it)")
    bus = bus_settings(SHARED)
    svc = await central(bus)
    nodes, per_node, t0 = [f"node-{i}" for i in range(8)], 6, time.time()
    posters = {n: NatsPoster(bus, n, 5.0) for n in nodes}

    async def publish(node: str) -> None:
        for k in range(per_node):
            batch = make_batch(node, f"{node}-{k}", [ib_sample(t0 + k, device=f"mlx5_{p}") for p in range(3)])
            headers = {"Content-Type": wire.MSGPACK, "Content-Encoding": "gzip", "X-Fabricd-Batch-Id": batch.batch_id}
            await _publish_when_stream_exists(posters[node], wire.encode(batch, wire.MSGPACK, compress=True), headers)

    await asyncio.gather(*(publish(n) for n in nodes))
    for p in posters.values():
        await p.aclose()
    await until(lambda: svc.bus.stored == len(nodes) * per_node)
    expected = Counter({(n, f"mlx5_{p}", t0 + k): 1 for n in nodes for p in range(3) for k in range(per_node)})
    assert stored(svc) == expected
    with svc.store.engine.connect() as conn:
        rows = [(node, ts) for node, *_series, ts in raw_points_by_series(conn.connection.driver_connection)]
    for n in nodes:
        in_table = [ts for node, ts in rows if node == n]
        assert in_table == sorted(in_table), f"{n}'s batches were stored out of order"


class _Msg:
    """A fetched message as the consumer sees it; ``ack`` fails when the connection is gone."""

    def __init__(self, node: str, k: int, connection_lost: bool = False) -> None:
        self.subject, self.connection_lost = f"fabricd.samples.0.{node}", connection_lost
        self.headers = {"Content-Type": wire.MSGPACK}
        self.data = f"{node}/{k}".encode()

    async def ack(self) -> None:
        import nats

        if self.connection_lost:
            raise nats.errors.ConnectionClosedError


class _SlowIngestor:
    def __init__(self, seconds: float) -> None:
        self.seconds, self.stored = seconds, list[bytes]()

    def ingest_body(self, _principal: Principal, body: Body) -> None:
        time.sleep(self.seconds)
        self.stored.append(body.data)


async def test_a_lost_connection_during_a_fetch_reaches_the_reconnect_loop_as_itself() -> None:
    """Acknowledgements failing on several nodes' tasks at once come out as the NATS error the
    reconnect loop catches, not as an exception group it would not."""
    import nats

    from fabricd.server.bus_consumer import BusConsumer

    ingestor = _SlowIngestor(0.0)
    consumer = BusConsumer(BusSettings(url=SHARED), ingestor)  # type: ignore[arg-type]
    msgs = [_Msg(f"n{i}", k, connection_lost=True) for i in range(3) for k in range(2)]
    with pytest.raises(nats.errors.ConnectionClosedError):
        await consumer._all(msgs)
    assert sorted(ingestor.stored) == [b"n0/0", b"n1/0", b"n2/0"]  # each node's first stored; its ack failed


async def test_a_cancelled_fetch_finishes_the_batches_being_stored_and_stops() -> None:
    """A released partition or a shutdown cancels the consumer: it returns once the batches its
    threads are storing are stored (no writer left behind), and stores nothing after them."""
    from fabricd.server.bus_consumer import BusConsumer

    ingestor = _SlowIngestor(0.3)
    consumer = BusConsumer(BusSettings(url=SHARED), ingestor)  # type: ignore[arg-type]
    task = asyncio.create_task(consumer._all([_Msg(f"n{i}", k) for i in range(3) for k in range(3)]))
    await asyncio.sleep(0.1)  # each node's first batch is being stored
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    # Stored, not acknowledged: redelivered, they are duplicates the next owner acknowledges.
    assert sorted(ingestor.stored) == [b"n0/0", b"n1/0", b"n2/0"] and consumer.stored == 0
    await asyncio.sleep(0.4)
    assert len(ingestor.stored) == 3  # nothing after them
