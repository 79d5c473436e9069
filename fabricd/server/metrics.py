"""``/metrics`` of the central service: the fleet view and the service's own health.

The fleet view is rendered at scrape time by ``FleetCollector`` from the latest point of each
series (``LatestReader.values``: kept in memory, ``series.latest_*`` its durable copy), named by ``fabricd.exposition.add_sample`` with a ``node`` label, so a
Prometheus scraping the central sees the same names as one scraping an agent. ``render`` writes the
fleet families as text from cached series prefixes (``fabricd.exposition_text``: ~0.5 M series within a scrape
timeout) and the rest with prometheus_client; the format is text 0.0.4 (no OpenMetrics). Series not updated
for ``metrics_stale_seconds`` are left out (a node that went away stops being exported instead of
freezing at its last value). Everything registers in the app's own ``CollectorRegistry``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fabricd import gctune
from fabricd.detect.settle import SettlementState
from fabricd.exposition_text import FleetText, TextFamily
from fabricd.model import IncidentKind, Severity
from fabricd.server.fleet_summary import FleetSignals, health_families
from fabricd.server.store.protocols import FleetHealthReader, IncidentCounter, LatestReader, NodeReader

log = logging.getLogger("fabricd.server.metrics")
# Ingest of one batch: from a few ms (SQLite, hundreds of samples) to seconds (50k samples, slow disk).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServerMetrics:
    """Counters the request handlers and background loops update."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.batches = Counter("fabricd_ingest_batches", "Batches accepted and stored", registry=registry)
        self.samples = Counter("fabricd_ingest_samples", "Samples accepted and stored", registry=registry)
        self.rejected = Counter(
            "fabricd_ingest_rejected_batches",
            "Batches refused, by reason (the error code)",
            ["reason"],
            registry=registry,
        )
        self.duplicates = Counter(
            "fabricd_ingest_duplicate_batches",
            "Batches acknowledged again without storing (a retry of a stored batch)",
            registry=registry,
        )
        self.series_created = Counter("fabricd_ingest_series_created", "New series stored", registry=registry)
        self.forwarded = Counter(
            "fabricd_ingest_forwarded_batches",
            "Batches taken over HTTP and published to the bus (a replica; the partition's owner stores them)",
            registry=registry,
        )
        self.duration = Histogram(
            "fabricd_ingest_duration_seconds",
            "Time to decode, check and store one batch",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.detection_lag = Gauge(
            "fabricd_detection_lag_seconds",
            "Wall time minus the event time of the newest sample the detectors processed",
            registry=registry,
        )
        self.detection_backlog = Gauge(
            "fabricd_detection_backlog_points", "Stored points the detectors have not processed yet", registry=registry
        )
        self.detection_errors = Counter("fabricd_detection_errors", "Detector runs that raised", registry=registry)
        self.topology_changes = Gauge(
            "fabricd_topology_changes",
            "Differences between the agents' LLDP topology and the stored one, by kind (problem: one-sided links)",
            ["kind"],
            registry=registry,
        )
        self.settled_ts = Gauge(
            "fabricd_detection_settled_timestamp_seconds",
            "Event time up to which every live node has delivered and detection has evaluated",
            registry=registry,
        )
        self.settlement_lag = Gauge(
            "fabricd_detection_settlement_lag_seconds",
            "Wall time minus the settled event time",
            registry=registry,
        )
        self.node_lateness = Gauge(
            "fabricd_detection_max_node_lateness_seconds",
            "Wall time minus the oldest watermark of a node still waited for",
            registry=registry,
        )
        self.nodes_left_out = Gauge(
            "fabricd_detection_nodes_left_out",
            "Nodes silent past the allowed lateness, left out of settlement",
            registry=registry,
        )
        self.node_left_out = Gauge(
            "fabricd_detection_node_left_out",
            "1 while this node is left out of settlement (silent past the allowed lateness)",
            ["node"],
            registry=registry,
        )
        self.late_samples = Counter(
            "fabricd_detection_late_samples",
            "Detection inputs that arrived after their moment was settled (folded into the next evaluation)",
            registry=registry,
        )
        self._left_out: set[str] = set()
        self.maintenance_deleted = Counter(
            "fabricd_store_deleted_points", "Points deleted past retention", registry=registry
        )
        self.maintenance_downsampled = Counter(
            "fabricd_store_downsampled_points", "Raw points folded into downsampled buckets", registry=registry
        )
        self.latest_flushed_series = Counter(
            "fabricd_store_latest_flushed_series",
            "Series rows whose latest value was written to the database",
            registry=registry,
        )
        self.latest_flush_errors = Counter(
            "fabricd_store_latest_flush_errors",
            "Writes of latest values that failed (kept in memory and retried)",
            registry=registry,
        )
        self.latest_flush_seconds = Histogram(
            "fabricd_store_latest_flush_duration_seconds",
            "Time to write the latest values changed since the previous write",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.latest_unflushed = Gauge(
            "fabricd_store_latest_unflushed_series",
            "Series whose latest value is in memory only (written every latest_flush_seconds)",
            registry=registry,
        )

    def observe_settlement(self, state: SettlementState, now: float, late_before: int) -> None:
        """Export the detector's settlement (``fabricd.detect.settle.SettlementState``)."""
        if state.settled_ts is not None:
            self.settled_ts.set(state.settled_ts)
            lag = max(0.0, now - state.settled_ts)
            self.settlement_lag.set(lag)
            self.detection_lag.set(lag)
        self.node_lateness.set(state.max_node_lateness_seconds)
        self.nodes_left_out.set(len(state.left_out))
        left = set(state.left_out)
        for node in self._left_out - left:
            self.node_left_out.remove(node)
        for node in left - self._left_out:  # those already out keep their 1: a step wakes per batch
            self.node_left_out.labels(node).set(1)
        self._left_out = left
        if state.late_samples > late_before:
            self.late_samples.inc(state.late_samples - late_before)


def render(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format 0.0.4, as ``generate_latest`` renders it, except
    that fleet families (``TextFamily``) render themselves from their cached series prefixes."""
    plain: list[Metric] = []
    fleet: list[str] = []
    for metric in registry.collect():
        if isinstance(metric, TextFamily):
            fleet.append(metric.text())
        else:
            plain.append(metric)
    return generate_latest(_Fixed(plain)) + "".join(fleet).encode()


class _Fixed(Collector):
    """Already collected metrics, for ``generate_latest``."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


class FleetNodes(NodeReader, FleetHealthReader, Protocol):
    """The inventory, as /metrics reads it: fleet counts always, node rows for the fleet view."""


@dataclass(frozen=True)
class FleetView:
    """What the central's /metrics holds beyond its bounded summaries (``metrics_fleet_*``)."""

    enabled: bool = False  # every node's latest series and per-node agent health: O(nodes)
    max_series: int = 500_000  # hard cap on those series per scrape
    stale_seconds: float = 300.0  # series (and derived values) older than this are left out
    node_stale_seconds: float = 120.0  # a node silent this long counts as stale


class FleetCollector(Collector):
    def __init__(
        self,
        latest: LatestReader,
        nodes: FleetNodes,
        incidents: IncidentCounter,
        view: FleetView,
        signals: FleetSignals,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.latest, self.node_reader, self.incidents = latest, nodes, incidents
        self.view, self.signals, self.clock = view, signals, clock
        # Per-family caps across the fleet; series refused are counted, never silently dropped.
        self.budget = signals.budget
        self.text = FleetText(self.budget)  # caches each series' rendered name and labels

    def describe(self) -> list[Metric]:
        return []  # no describe-time queries: the database may not be migrated yet at registration

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("fabricd_store_up", "1 if the fleet view could be read from the database")
        now = self.clock()
        try:
            metrics = [
                *health_families(self.node_reader, now - self.view.node_stale_seconds),
                *self.signals.families(now - self.view.stale_seconds),
                *self._incidents(),
            ]
            if self.view.enabled:
                metrics += [*self._fleet(now), *self._agents()]
        except Exception:  # a scrape must say the store is down, not fail as a whole
            log.exception("cannot read the fleet view for /metrics")
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from metrics
        yield self.budget.refused_family()

    def _fleet(self, now: float) -> list[TextFamily]:
        # Rows come ordered by node, so families hold their series node by node, as when grouped.
        # A 1,000-node scrape allocates ~1.5 M objects that live to its end: full collections over
        # the heap tripled reading the latest values (7.0 s -> 1.9 s measured without them).
        with gctune.paused():
            rows = self.latest.values(fresh_since=now - self.view.stale_seconds)
            return self.text.families(rows, max_series=self.view.max_series)

    def _agents(self) -> list[Metric]:
        seen = GaugeMetricFamily(
            "fabricd_agent_last_seen_timestamp_seconds",
            "When the central last accepted a batch from the node's agent",
            labels=["node"],
        )
        info = GaugeMetricFamily("fabricd_agent_info", "Agent version per node", labels=["node", "version"])
        ok = GaugeMetricFamily(
            "fabricd_collector_success",
            "1 if the collector's last run on the node succeeded",
            labels=["node", "collector"],
        )
        took = GaugeMetricFamily(
            "fabricd_collector_duration_seconds", "Duration of the collector's last run", labels=["node", "collector"]
        )
        for node in self.node_reader.nodes():
            seen.add_metric([node.name], node.last_seen)
            info.add_metric([node.name, node.agent_version], 1.0)
            for h in node.collectors:
                ok.add_metric([node.name, h.collector], 1.0 if h.success else 0.0)
                took.add_metric([node.name, h.collector], h.duration_seconds)
        return [seen, info, ok, took]

    def _incidents(self) -> list[Metric]:
        counts = {(k.value, s.value): 0 for k in IncidentKind for s in Severity}
        for c in self.incidents.open_counts():
            counts[(c.kind, c.severity)] = counts.get((c.kind, c.severity), 0) + c.count
        fam = GaugeMetricFamily(
            "fabricd_incidents_open", "Incidents not yet resolved (open or acknowledged)", labels=["kind", "severity"]
        )
        for (kind, severity), n in sorted(counts.items()):
            fam.add_metric([kind, severity], float(n))
        return [fam]
