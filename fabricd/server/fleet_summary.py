"""The central's bounded ``/metrics``: fleet-wide summaries whose size does not grow with the fleet.

Prometheus scrapes each agent for its node's series (node_exporter's pattern). The central adds
what only it knows, in a number of series set by the signal table, the collectors and the agent
versions in use, not by the number of nodes:

- ``fabricd_fleet_signal_*{signal}``: per derived signal (``fabricd/signal_table.py``), how many
  series report it, their mean, and the worst one with its ``node``/``device``/``port`` (where to
  look first);
- ``fabricd_fleet_nodes{state}``, ``fabricd_fleet_agent_version_nodes{version}``,
  ``fabricd_fleet_collector_nodes{collector,state}``: how many nodes report, run which agent, and
  whose collectors fail.

``FleetSignals`` is fed by ingest (the newest value of every derived series, in memory, like the
latest values) and summarised at scrape time: one pass over the derived series, ~20 per node.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from itertools import islice
from operator import itemgetter

from prometheus_client.core import GaugeMetricFamily, Metric

from fabricd.exposition import SeriesBudget
from fabricd.model import Labels, Sample
from fabricd.naming import metric_stem
from fabricd.server.store.protocols import FleetHealthReader
from fabricd.wire_columns import SampleColumns

DERIVED = "derived"
SIGNAL_PREFIX = "fabricd_derived_"
MAX_SIGNALS = 128  # the signal table has ~20; more means an agent sends names of its own
MAX_VERSIONS = 32  # agent versions exported one by one; the rest are counted as "other"
_Key = tuple[str, str, str, Labels]  # node, device, port, labels
_TS, _VALUE = itemgetter(0), itemgetter(1)


class FleetSignals:
    """The newest value of each derived series, by signal; thread-safe (ingest runs in threads)."""

    def __init__(self, budget: SeriesBudget | None = None) -> None:
        self.budget = budget or SeriesBudget()
        self._lock = threading.Lock()
        self._by_signal: dict[str, dict[_Key, tuple[float, float]]] = {}  # -> (ts, value)

    def observe(self, node: str, samples: Sequence[Sample]) -> None:
        """Ingest's hook, after a batch is stored: keep its derived samples' values."""
        if isinstance(samples, SampleColumns):  # decoded by ingest: only the derived samples are built
            if DERIVED not in samples.sources:
                return
            derived = samples.where(src == DERIVED for src in samples.source).samples()
        else:
            derived = [s for s in samples if s.reading.source == DERIVED]
        if not derived:
            return
        with self._lock:
            by_signal = self._by_signal
            for s in derived:
                r = s.reading
                signal = metric_stem(r.source, r.metric, r.unit).removeprefix(SIGNAL_PREFIX)
                series = by_signal.get(signal)
                if series is None:
                    if len(by_signal) >= MAX_SIGNALS:
                        self.budget.refused[("fabricd_fleet_signal_series", "family_cap")] += 1
                        continue
                    series = by_signal[signal] = {}
                key = (node, r.device, r.port, r.labels)
                old = series.get(key)
                if old is None or old[0] <= s.ts:  # a spooled backlog never replaces a newer value
                    series[key] = (s.ts, r.value)

    def families(self, fresh_since: float) -> list[Metric]:
        """Per signal: series count, mean and the worst series; values older than ``fresh_since``
        are dropped for good (a node that went away stops counting)."""
        count = GaugeMetricFamily(
            "fabricd_fleet_signal_series", "Series reporting the derived signal across the fleet", labels=["signal"]
        )
        mean = GaugeMetricFamily(
            "fabricd_fleet_signal_mean", "Mean of the derived signal over the fleet's series", labels=["signal"]
        )
        worst = GaugeMetricFamily(
            "fabricd_fleet_signal_max",
            "Highest value of the derived signal in the fleet, with where it is",
            labels=["signal", "node", "device", "port"],
        )
        # C-level passes only (map, min, max, index): 200,000 derived series at 10,000 nodes.
        with self._lock:
            for signal in sorted(self._by_signal):
                series = self._by_signal[signal]
                if series and min(map(_TS, series.values())) < fresh_since:
                    for k in [k for k, (ts, _v) in series.items() if ts < fresh_since]:
                        del series[k]
                if not series:
                    continue
                values = list(map(_VALUE, series.values()))
                best = max(values)
                top = next(islice(series, values.index(best), None))
                count.add_metric([signal], float(len(values)))
                mean.add_metric([signal], math.fsum(values) / len(values))
                worst.add_metric([signal, top[0], top[1], top[2]], best)
        return [count, mean, worst]


def health_families(reader: FleetHealthReader, stale_before: float) -> Iterator[Metric]:
    """How many nodes report, with which agent version, and whose collectors fail."""
    h = reader.fleet_health(stale_before)
    nodes = GaugeMetricFamily(
        "fabricd_fleet_nodes", "Nodes known to the central, by whether they sent a batch lately", labels=["state"]
    )
    nodes.add_metric(["reporting"], float(h.reporting))
    nodes.add_metric(["stale"], float(h.stale))
    yield nodes
    versions = GaugeMetricFamily(
        "fabricd_fleet_agent_version_nodes", "Nodes by the agent version they last reported", labels=["version"]
    )
    ranked = sorted(h.versions, key=lambda vn: (-vn[1], vn[0]))
    for version, n in ranked[:MAX_VERSIONS]:
        versions.add_metric([version], float(n))
    if len(ranked) > MAX_VERSIONS:
        versions.add_metric(["other"], float(sum(n for _v, n in ranked[MAX_VERSIONS:])))
    yield versions
    collectors = GaugeMetricFamily(
        "fabricd_fleet_collector_nodes",
        "Nodes by the outcome of the collector's last run (ok or failing)",
        labels=["collector", "state"],
    )
    for collector, ok, n in sorted(h.collectors):
        collectors.add_metric([collector, "ok" if ok else "failing"], float(n))
    yield collectors
