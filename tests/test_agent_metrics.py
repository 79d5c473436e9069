"""The agent's own ``/metrics`` (``fabricd.agent.metrics_text``, ``metrics_http``) against the old one.

The oracle is what the agent served before: prometheus_client's ``generate_latest`` over the
registry holding the transport's metrics and ``exposition.families`` of the node's samples. The
new page must parse (prometheus_client's parser and ``promtool check metrics``) to exactly the
same samples, scrape after scrape while its template is reused and when the shape changes.
"""

from __future__ import annotations

import asyncio
import gzip
import math
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from fabricd.agent import metrics_http
from fabricd.agent.main import LatestScrape, metrics_page
from fabricd.agent.metrics_text import NodeText
from fabricd.exposition import families
from fabricd.model import CollectorHealth, Kind, Reading, Sample, Status
from fabricd.settings import AgentSettings
from fabricd.transport import Transport
from tests.catalogue_samples import all_samples
from tests.helpers import need_binary
from tests.test_transport_central_double import free_port

T0 = 1_800_000_000.0
Parsed = list[tuple[str, str, str, list[tuple[str, tuple[tuple[str, str], ...], str]]]]


def parsed(text: str, add: dict[str, str] | None = None) -> Parsed:
    """(name, type, HELP, samples) per family, sorted; values by repr so NaN equals NaN and an int
    ``3`` equals ``3.0`` (the text differs there: the value does not). ``add``: labels given to
    every sample that lacks them."""
    extra = add or {}
    return sorted(
        (
            f.name,
            f.type,
            f.documentation,
            sorted((s.name, tuple(sorted({**extra, **s.labels}.items())), repr(float(s.value))) for s in f.samples),
        )
        for f in text_string_to_metric_families(text)
    )


class _Old:
    """The agent's registry collector before NodeText: ``families`` of the samples."""

    def __init__(self, samples: Sequence[Sample], node: str) -> None:
        self.samples, self.node = samples, node

    def collect(self) -> Iterator[Metric]:
        return iter(families(self.samples, self.node))


def old_text(samples: Sequence[Sample], node: str = "node-001") -> str:
    return generate_latest(_Old(samples, node)).decode()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> list[Sample]:
    """Every real collector's samples on its fixtures, second scrape (rates, derived signals)."""
    return [s for ss in asyncio.run(all_samples(tmp_path_factory.mktemp("agent"))).values() for s in ss]


def test_real_collector_samples_render_as_before_scrape_after_scrape(emitted: list[Sample]) -> None:
    assert len(emitted) > 200
    text = NodeText("node-001")
    first = text.render(emitted).decode()
    assert parsed(first) == parsed(old_text(emitted))
    template = text.template
    again = text.render(emitted).decode()  # from the kept template
    assert text.template is template
    assert again == first


def _reading(
    counter: str, value: float, kind: Kind = Kind.COUNTER, labels: tuple[tuple[str, str], ...] = ()
) -> Reading:
    return Reading("infiniband", "mlx5_0", "1", counter, value, "bytes", kind, labels, "")


def test_every_kind_escaping_float_format_and_percent_signs_match() -> None:
    nasty = (("cable", 'say "hi" 100%s \\ \n next'), ("ünï", "cödé"), ("detail", "free text is dropped"))
    values = [0.0, -1.5, 1e-9, 3, 999999.5, 1e6, 12345678.0, 1.7e19, 2**64 - 1.0, 123456789012.0]
    samples = [Sample(T0, _reading(f"c{i}", v, labels=nasty), rate=v / 7) for i, v in enumerate(values)]
    samples += [
        Sample(T0, _reading("sat", 2**32 - 1.0), None, Status.SATURATED, since=T0 - 60),
        Sample(T0, _reading("sat2", 2**32 - 1.0), None, Status.SATURATED),
        Sample(T0, _reading("first", 5.0), None, Status.FIRST),
        Sample(T0, _reading("state", 3.0, Kind.GAUGE)),
        Sample(T0, _reading("fw", 0.0, Kind.INFO, (("version", "28.39.1002"),))),
        Sample(T0 + 0.5, _reading("abort", 1.0, Kind.EVENT)),
    ]
    assert parsed(NodeText("node-001").render(samples).decode()) == parsed(old_text(samples))


def test_nan_and_infinities_are_spelled_as_prometheus_client_spells_them() -> None:
    samples = [Sample(T0, _reading(f"c{i}", 1.0), rate=v) for i, v in enumerate([math.inf, -math.inf, math.nan, 2.5])]
    text = NodeText("n").render(samples).decode()
    assert [line.rsplit(" ", 1)[1] for line in text.splitlines() if "_per_second{" in line] == [
        "+Inf",
        "-Inf",
        "NaN",
        "2.5",
    ]
    assert parsed(text) == parsed(old_text(samples, "n"))


def test_a_change_of_shape_rebuilds_the_template_and_values_follow() -> None:
    text = NodeText("n")
    scrape1 = [Sample(T0, _reading("a", 1.0), None, Status.FIRST), Sample(T0, _reading("b", 2.0), None, Status.FIRST)]
    scrape2 = [Sample(T0 + 10, _reading("a", 11.0), rate=1.0), Sample(T0 + 10, _reading("b", 22.0), rate=2.0)]
    scrape3 = [Sample(T0 + 20, _reading("b", 2.0**32 - 1), None, Status.SATURATED, since=T0 + 15)]  # a went away
    scrape4 = [Sample(T0 + 30, _reading("b", 42.0), rate=0.5)]
    for scrape in (scrape1, scrape2, scrape2, scrape3, scrape4):
        assert parsed(text.render(scrape).decode()) == parsed(old_text(scrape, "n"))
    assert b"fabricd_infiniband_a_bytes" not in text.template


def test_a_repeated_series_is_exposed_once_with_the_last_value() -> None:
    samples = [Sample(T0, _reading("a", 1.0), rate=1.0), Sample(T0, _reading("a", 9.0), rate=3.0)]
    text = NodeText("n").render(samples).decode()
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        'fabricd_infiniband_a_bytes_total{device="mlx5_0",node="n",port="1"} 9',
        'fabricd_infiniband_a_bytes_per_second{device="mlx5_0",node="n",port="1"} 3.0',
    ]
    assert parsed(text) == parsed(old_text(samples, "n"))


def _agent_registry(tmp_path: Path, samples: list[Sample]) -> tuple[CollectorRegistry, LatestScrape]:
    registry = CollectorRegistry()
    transport = Transport(AgentSettings(node="node-001", data_dir=tmp_path), agent_version="test", registry=registry)
    transport.metrics.dropped.labels(reason="corrupt").inc(2)
    tee = LatestScrape(transport, "node-001")
    registry.register(tee)
    tee.samples = samples
    tee.health = [CollectorHealth("infiniband", True, 0.004, T0), CollectorHealth("nccl", False, 0.5, T0, "boom")]
    return registry, tee


async def _scrape(port: int, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(headers=headers) as client:
        return await client.get(f"http://127.0.0.1:{port}/metrics")


async def _serve_and_scrape(registry: CollectorRegistry, tee: LatestScrape) -> tuple[httpx.Response, httpx.Response]:
    port = free_port()
    server = await metrics_http.serve("127.0.0.1", port, metrics_page(registry, tee))
    try:
        return await _scrape(port, {"Accept-Encoding": "identity"}), await _scrape(port, {"Accept-Encoding": "gzip"})
    finally:
        server.close()
        await server.wait_closed()


def test_the_page_over_http_equals_the_old_registry_and_passes_promtool(tmp_path: Path, emitted: list[Sample]) -> None:
    promtool = need_binary("promtool")
    registry, tee = _agent_registry(tmp_path, emitted)
    # Before: one registry, the samples in it; now the agent's own series also carry its node.
    old = sorted(parsed(generate_latest(registry).decode(), {"node": "node-001"}) + parsed(old_text(emitted)))
    plain, zipped = asyncio.run(_serve_and_scrape(registry, tee))
    assert plain.status_code == 200
    assert plain.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "content-encoding" not in plain.headers
    assert zipped.headers["content-encoding"] == "gzip"
    assert zipped.text == plain.text  # httpx gunzips
    assert parsed(plain.text) == old
    check = subprocess.run([promtool, "check", "metrics"], input=plain.text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


class _Conn:
    """A raw TCP client: what a scraper or a stray client sends, byte for byte."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def ask(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        self.writer.write(request)
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:] if line)}
        body = await self.reader.readexactly(int(headers["content-length"])) if b"HEAD" not in request[:4] else b""
        return status, headers, body

    async def closed(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), 5) == b""

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:  # the server closed first
            pass


@pytest.fixture
async def served() -> asyncio.AbstractEventLoop:  # type: ignore[misc]
    port = free_port()
    pages = iter([b"a 1.0\n", b"a 2.0\n", b"a 3.0\n", b"a 4.0\n"])
    server = await metrics_http.serve("127.0.0.1", port, lambda: next(pages))

    conns: list[_Conn] = []

    async def connect() -> _Conn:
        conns.append(_Conn(*await asyncio.open_connection("127.0.0.1", port)))
        return conns[-1]

    yield connect  # type: ignore[misc]
    for conn in conns:
        await conn.close()
    server.close()
    await server.wait_closed()


async def test_one_kept_alive_connection_serves_scrape_after_scrape(served) -> None:  # type: ignore[no-untyped-def]
    conn = await served()
    get = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n"
    first = await conn.ask(get)
    second = await conn.ask(get)
    assert (first[0], gzip.decompress(first[2])) == (200, b"a 1.0\n")
    assert (second[0], gzip.decompress(second[2])) == (200, b"a 2.0\n")
    assert "connection" not in second[1]


async def test_head_root_and_http10_close(served) -> None:  # type: ignore[no-untyped-def]
    conn = await served()
    status, headers, _ = await conn.ask(b"HEAD /metrics HTTP/1.1\r\n\r\n")
    assert (status, headers["content-length"]) == (200, "6")
    status, _, body = await conn.ask(b"GET /?x=1 HTTP/1.1\r\n\r\n")
    assert (status, body) == (200, metrics_http.LANDING)
    status, headers, body = await conn.ask(b"GET /metrics HTTP/1.0\r\n\r\n")
    assert (status, headers["connection"], body) == (200, "close", b"a 2.0\n")
    assert await conn.closed()


@pytest.mark.parametrize(
    ("request_bytes", "status", "closes"),
    [
        (b"GET /nope HTTP/1.1\r\n\r\n", 404, False),
        (b"POST /metrics HTTP/1.1\r\n\r\n", 405, False),
        (b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n", 200, True),
        (b"GARBAGE\r\n\r\n", 400, True),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400, True),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", 400, True),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"y" * (metrics_http.MAX_REQUEST_BYTES + 1), 431, True),
    ],
)
async def test_bad_or_odd_requests_get_a_clear_status(served, request_bytes: bytes, status: int, closes: bool) -> None:  # type: ignore[no-untyped-def]
    conn = await served()
    got, _headers, _body = await conn.ask(request_bytes)
    assert got == status
    if closes:
        assert await conn.closed()
    else:  # the connection still serves the next scrape
        assert (await conn.ask(b"GET /metrics HTTP/1.1\r\n\r\n"))[0] == 200


async def test_a_render_error_is_a_500_and_the_server_keeps_serving() -> None:
    port = free_port()
    calls = iter([RuntimeError("bug"), b"a 1.0\n"])

    def page() -> bytes:
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return item

    server = await metrics_http.serve("127.0.0.1", port, page)
    try:
        conn = _Conn(*await asyncio.open_connection("127.0.0.1", port))
        assert (await conn.ask(b"GET /metrics HTTP/1.1\r\n\r\n"))[0] == 500
        assert (await conn.ask(b"GET /metrics HTTP/1.1\r\n\r\n"))[:3:2] == (200, b"a 1.0\n")
        await conn.close()
    finally:
        server.close()
        await server.wait_closed()


def test_registry_text_equals_generate_latest_as_its_series_change() -> None:
    from prometheus_client import Counter, Gauge, Histogram

    from fabricd.exposition_text import RegistryText

    registry = CollectorRegistry()
    c = Counter("x_events", "Events, by kind", ["kind"], registry=registry)
    g = Gauge("x_level", 'A level with "quotes", 100% and \\ in its help', registry=registry)
    h = Histogram("x_seconds", "Durations", buckets=(0.1, 1.0), registry=registry)
    text = RegistryText()
    for step in range(4):  # new children appear (steps 1, 2), values change, a NaN and an infinity
        c.labels("a").inc()
        if step >= 1:
            c.labels('b"%s').inc(2.5)
        g.set([1.0, math.nan, math.inf, 2e19][step])
        h.observe(0.05 * step)
        assert parsed(text.render(registry.collect())) == parsed(generate_latest(registry).decode())


async def test_a_series_reported_now_and_then_stays_on_the_page_until_it_is_old(tmp_path: Path) -> None:
    """NCCL-tests results arrive once per run: between runs the page keeps the last one (as the
    central did), and drops it once it is older than KEEP_SECONDS."""
    from fabricd.agent.main import KEEP_SECONDS

    _registry, tee = _agent_registry(tmp_path, [])
    nccl = Reading("nccl", "all_reduce", "", "busbw", 1e10, "bytes/s", Kind.GAUGE, (("size", "1048576"),), "busbw")
    await tee.submit([Sample(T0, nccl), Sample(T0, _reading("a", 1.0))], [])
    await tee.submit([Sample(T0 + 10, _reading("a", 2.0), rate=0.1)], [])
    assert [(s.reading.counter, s.ts) for s in tee.samples] == [("busbw", T0), ("a", T0 + 10)]
    await tee.submit([Sample(T0 + KEEP_SECONDS + 1, _reading("a", 3.0), rate=0.1)], [])
    assert [(s.reading.counter, s.ts) for s in tee.samples] == [("a", T0 + KEEP_SECONDS + 1)]
