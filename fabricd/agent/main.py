"""``fabricd agent``'s wiring: settings -> collectors -> Agent -> Transport, until SIGTERM.

Exit codes: 0 after a clean stop (SIGTERM/SIGINT: the pending batch is sent or spooled first),
2 for a configuration problem found at start (the message names the bad key or path).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PromCollector

from fabricd import __version__, gctune, logs
from fabricd.agent import metrics_http
from fabricd.agent.agent import Agent, Sink
from fabricd.agent.metrics_text import NodeText
from fabricd.agent.runtime import CollectorRunner
from fabricd.clock import SystemClock
from fabricd.collector import Collector, CollectorConfigError, build_collectors
from fabricd.exposition_text import RegistryText
from fabricd.model import CollectorHealth, Sample
from fabricd.settings import AgentSettings, TransportSettings, parse_listen
from fabricd.transport import Transport

log = logging.getLogger("fabricd.agent")


class ConfigError(Exception):
    """A problem found at start that the operator must fix; exit 2 with this message."""


# A series the collectors stopped reporting stays on /metrics this long (the central's default
# metrics_stale_seconds): an NCCL-tests result or a probe outcome holds until the next one, as on
# the central; a port that went away leaves.
KEEP_SECONDS = 300.0


class LatestScrape(PromCollector):
    """Tee in front of the transport keeping the newest sample of each series for the agent's
    local /metrics: the samples render through ``NodeText`` (``page``), the collectors' health
    through the registry. Not only the last scrape: some collectors report a series only when it
    changes (a new NCCL-tests run), and Prometheus would mark it stale at the next scrape."""

    def __init__(self, sink: Sink, node: str, version: str = __version__) -> None:
        self.sink = sink
        self.node = node
        self.version = version
        self.samples: Sequence[Sample] = ()
        self.health: Sequence[CollectorHealth] = ()
        self._latest: dict[tuple[object, ...], Sample] = {}  # insertion order: the page's order holds

    async def submit(self, samples: Sequence[Sample], health: Sequence[CollectorHealth]) -> None:
        latest = self._latest
        for s in samples:
            r = s.reading
            latest[r.series or r.key()] = s
        if samples:
            cutoff = samples[0].ts - KEEP_SECONDS
            for key in [k for k, s in latest.items() if s.ts < cutoff]:
                del latest[key]
        # Rebinding (not mutating) keeps a reader's view consistent without a lock.
        self.samples, self.health = list(latest.values()), list(health)
        await self.sink.submit(samples, health)

    def collect(self) -> Iterator[Metric]:
        # node and version as labels: what joins this target's series to its node in PromQL
        # (``* on(instance, job) group_left(node) fabricd_agent_info``), as node_exporter's uname info.
        info = GaugeMetricFamily("fabricd_agent_info", "Agent version per node (value 1)", labels=["node", "version"])
        info.add_metric([self.node, self.version], 1.0)
        yield info
        yield from _health_families(self.node, self.health)


def _health_families(node: str, health: Sequence[CollectorHealth]) -> Iterator[Metric]:
    labels = ["node", "collector"]  # as the central's fleet view names them
    ok = GaugeMetricFamily("fabricd_collector_success", "1 if the collector's last run succeeded", labels=labels)
    took = GaugeMetricFamily(
        "fabricd_collector_duration_seconds", "Duration of the collector's last run", labels=labels
    )
    for h in health:
        ok.add_metric([node, h.collector], 1.0 if h.success else 0.0)
        took.add_metric([node, h.collector], h.duration_seconds)
    yield ok
    yield took


def configured_collectors(settings: AgentSettings) -> dict[str, dict[str, Any]]:
    from collectors import DEFAULT_COLLECTORS

    return dict(settings.collectors) or {name: {} for name in DEFAULT_COLLECTORS}


def run_agent(settings: AgentSettings) -> int:
    from collectors import REGISTRY

    # httpx logs every request at INFO; the transport logs what an operator needs (outages, drops).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        collectors = build_collectors(
            configured_collectors(settings), node=settings.node, sysfs_root=settings.sysfs_root, registry=REGISTRY
        )
        return asyncio.run(_serve(settings, collectors))
    except (CollectorConfigError, ConfigError) as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 2


def metrics_page(registry: CollectorRegistry, tee: LatestScrape) -> Callable[[], bytes]:
    """The agent's /metrics: its own metrics (transport, collectors' health) and its samples."""
    # Every series carries the node, as the samples do: dashboards and alerts select by node
    # whether Prometheus scrapes the agent or reads the central's fleet view.
    own, samples = RegistryText({"node": tee.node}), NodeText(tee.node)
    return lambda: own.render(registry.collect()).encode() + samples.render(tee.samples)


async def _serve(settings: AgentSettings, collectors: dict[str, Collector]) -> int:
    registry = CollectorRegistry()
    transport = Transport(settings, agent_version=__version__, registry=registry, **_bus_poster(settings))
    tee = LatestScrape(transport, settings.node)
    registry.register(tee)
    try:
        await transport.start()
    except OSError as exc:
        raise ConfigError(f"spool: cannot open {transport.spool.dir}: {exc.strerror or exc}") from exc
    # /metrics only once the spool is indexed: before, its gauges said 0 batches held while the
    # spool held a previous run's (a restart's first scrape read "drained"; CI's
    # tests/test_agent_acceptance.py, the truncated spool file, saw no quarantine yet).
    try:
        stop_metrics = await _start_metrics(settings.metrics_listen, metrics_page(registry, tee))
    except ConfigError:
        await transport.close()
        raise
    runner = CollectorRunner(collectors, settings.collector_timeout_seconds)
    agent = Agent(runner, tee, SystemClock(), settings.interval_seconds)
    stop = asyncio.Event()
    _on_signals(stop)
    gctune.tune_for_service()  # the collectors' open files and plans live as long as the agent
    try:
        await agent.run(stop)
    finally:
        logs.event(log, logging.INFO, "agent stopping; flushing the pending batch")
        await transport.close()
        await runner.close()
        await stop_metrics()
    return 0


def _bus_poster(settings: AgentSettings) -> dict[str, Any]:
    """With ``bus.url``, the transport publishes to NATS JetStream instead of POSTing."""
    if not settings.bus.url:
        return {}
    from fabricd.extras import MissingExtra, require

    try:
        require("bus", "bus.url (publishing to NATS)")
    except MissingExtra as exc:
        raise ConfigError(str(exc)) from exc
    from fabricd.transport.nats_poster import NatsPoster

    def factory(transport: TransportSettings) -> NatsPoster:
        return NatsPoster(settings.bus, settings.node, transport.timeout_seconds)

    logs.event(log, logging.INFO, "publishing batches to NATS JetStream", url=settings.bus.url)
    return {"poster_factory": factory}


def _on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def _start_metrics(listen: str, page: Callable[[], bytes]) -> Callable[[], Awaitable[None]]:
    """Serve /metrics on ``listen`` (empty: not at all); returns the coroutine that stops it."""
    if not listen:
        return _nothing
    try:
        host, port = parse_listen(listen)
        server = await metrics_http.serve(host, port, page)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"metrics_listen: cannot serve on {listen!r}: {exc}") from exc
    logs.event(log, logging.INFO, "serving agent metrics", listen=listen)

    async def stop() -> None:
        server.close()
        await server.wait_closed()

    return stop


async def _nothing() -> None:
    return None
