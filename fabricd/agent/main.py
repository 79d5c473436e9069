"""``fabricd agent``'s wiring: settings -> collectors -> Agent -> Transport, until SIGTERM.

Exit codes: 0 after a clean stop (SIGTERM/SIGINT: the pending batch is sent or spooled first),
2 for a configuration problem found at start (the message names the bad key or path).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PromCollector

from fabricd import __version__, gctune, logs
from fabricd.agent.agent import Agent, Sink
from fabricd.agent.runtime import CollectorRunner
from fabricd.clock import SystemClock
from fabricd.collector import Collector, CollectorConfigError, build_collectors
from fabricd.exposition import families
from fabricd.model import CollectorHealth, Sample
from fabricd.settings import AgentSettings, parse_listen
from fabricd.transport import Transport

log = logging.getLogger("fabricd.agent")


class ConfigError(Exception):
    """A problem found at start that the operator must fix; exit 2 with this message."""


class LatestScrape(PromCollector):
    """Tee in front of the transport keeping the last scrape for the agent's local /metrics."""

    def __init__(self, sink: Sink, node: str) -> None:
        self.sink = sink
        self.node = node
        self.samples: Sequence[Sample] = ()
        self.health: Sequence[CollectorHealth] = ()

    async def submit(self, samples: Sequence[Sample], health: Sequence[CollectorHealth]) -> None:
        # Rebinding (not mutating) keeps the scrape thread's view consistent without a lock.
        self.samples, self.health = list(samples), list(health)
        await self.sink.submit(samples, health)

    def collect(self) -> Iterator[Metric]:
        yield from families(self.samples, self.node)
        yield from _health_families(self.health)


def _health_families(health: Sequence[CollectorHealth]) -> Iterator[Metric]:
    ok = GaugeMetricFamily("fabricd_collector_success", "1 if the collector's last run succeeded", labels=["collector"])
    took = GaugeMetricFamily(
        "fabricd_collector_duration_seconds", "Duration of the collector's last run", labels=["collector"]
    )
    for h in health:
        ok.add_metric([h.collector], 1.0 if h.success else 0.0)
        took.add_metric([h.collector], h.duration_seconds)
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


async def _serve(settings: AgentSettings, collectors: dict[str, Collector]) -> int:
    registry = CollectorRegistry()
    stop_metrics = _start_metrics(settings.metrics_listen, registry)
    transport = Transport(settings, agent_version=__version__, registry=registry)
    try:
        await transport.start()
    except OSError as exc:
        stop_metrics()
        raise ConfigError(f"spool: cannot open {transport.spool.dir}: {exc.strerror or exc}") from exc
    tee = LatestScrape(transport, settings.node)
    registry.register(tee)
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
        stop_metrics()
    return 0


def _on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


def _start_metrics(listen: str, registry: CollectorRegistry) -> Callable[[], None]:
    """Serve /metrics on ``listen`` (empty: not at all); returns the function that stops it."""
    if not listen:
        return lambda: None
    try:
        host, port = parse_listen(listen)
        httpd, _thread = start_http_server(port, host, registry)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"metrics_listen: cannot serve on {listen!r}: {exc}") from exc
    logs.event(log, logging.INFO, "serving agent metrics", listen=listen)

    def stop() -> None:
        httpd.shutdown()
        httpd.server_close()

    return stop
