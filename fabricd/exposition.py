"""Prometheus names and exposition for fabricd samples (agent ``/metrics``, ``fabricd collect``, central).

Naming per Prometheus conventions (https://prometheus.io/docs/practices/naming/):

- ``fabricd_<source>_<name>[_<unit>]_total``: counters, value normalized to base units;
- ``..._per_second``: gauges with the agent-computed rate (wraps, resets and saturation handled,
  which ``rate()`` over a raw counter cannot do);
- plain gauges for levels, ``..._info`` gauges (value 1) for strings, and
  ``..._last_timestamp_seconds`` for events (an aborted NCCL run);
- ``fabricd_saturated_since_timestamp_seconds`` for a counter clamped at all ones: its rate is
  unknown since then, not 0.

Labels are few and stable: ``node``, ``device`` (``op`` for NCCL-tests, ``peer`` for the pingmesh),
``port`` and the reading's own (``priority``, ``size``...). Free-text labels (an error message) are
left out, and every family is capped (``Limits``): series past the cap are refused and counted in
``fabricd_exporter_series_refused_total{family,reason}`` so a rogue agent cannot explode Prometheus.
Every family name is listed in ``fabricd.catalogue`` (checked by tests against real collector output).
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.registry import CollectorRegistry

from fabricd import catalogue
from fabricd.model import Kind, Sample, Status
from fabricd.naming import metric_stem, sanitize

log = logging.getLogger("fabricd.exposition")

# What ``device`` means for sources whose "device" is not a NIC.
DEVICE_LABEL: dict[str, str] = {
    "nccl": "op",
    "pingmesh": "peer",
    "job": "job_id",
    "gpu": "gpu",
    "inspector": "collective",
    "ras": "group",
}
# Free text from tools or drivers: unbounded values, kept in the REST API and incidents, not here.
FREE_TEXT_LABELS = frozenset({"detail", "error", "message"})
REFUSED = "fabricd_exporter_series_refused"
SATURATED = "fabricd_saturated_since_timestamp_seconds"


@dataclass(frozen=True)
class Limits:
    """Cardinality caps per scrape. 20,000 series per family covers a 1,000-node fleet with 8 HCAs
    and two PFC priorities per port; past that a family is almost certainly a label gone wrong."""

    max_series_per_family: int = 20_000
    max_label_value_length: int = 128


@dataclass
class SeriesBudget:
    """The caps of one exporter and its cumulative count of refused series (a Prometheus counter)."""

    limits: Limits = field(default_factory=Limits)
    refused: Tally[tuple[str, str]] = field(default_factory=Tally)

    def refused_family(self) -> Metric:
        fam = CounterMetricFamily(REFUSED, catalogue.help_for(REFUSED + "_total"), labels=["family", "reason"])
        for (family, reason), n in sorted(self.refused.items()):
            fam.add_metric([family, reason], float(n))
        return fam


class SeriesSink(Protocol):
    """Where ``add_sample`` puts each exposed series: ``_Builder``, or the central's fleet text cache."""

    def add(self, mtype: str, name: str, labels: Mapping[str, str], value: float, doc: str) -> None: ...


class _Builder:
    """Families keyed by name; one name never gets two types, a series never appears twice."""

    def __init__(self, budget: SeriesBudget) -> None:
        self.budget = budget
        self.fams: dict[str, Metric] = {}
        self.owner: dict[str, str] = {}  # exposed sample name -> family name
        self.series: dict[str, dict[tuple[tuple[str, str], ...], tuple[str, float]]] = {}
        self.logged: set[tuple[str, str]] = set()

    def add(self, mtype: str, name: str, labels: Mapping[str, str], value: float, doc: str) -> None:
        fam = self.fams.get(name)
        if fam is None:
            if self.owner.setdefault(exposed_name(name, mtype), name) != name:
                return self._refuse(name, "type_conflict")  # a gauge "x_total" next to a counter "x"
            fam = self.fams[name] = Metric(name, catalogue.help_for(exposed_name(name, mtype)) or doc, mtype)
            self.series[name] = {}
        if fam.type != mtype:
            return self._refuse(name, "type_conflict")
        if any(len(v) > self.budget.limits.max_label_value_length for v in labels.values()):
            return self._refuse(name, "label_too_long")
        key = tuple(sorted(labels.items()))
        series = self.series[name]
        if key not in series and len(series) >= self.budget.limits.max_series_per_family:
            return self._refuse(name, "family_cap")
        series[key] = (exposed_name(name, mtype), value)  # a repeat of a series: the last value wins
        return None

    def _refuse(self, name: str, reason: str) -> None:
        refuse(self.budget, self.logged, name, reason)

    def build(self) -> list[Metric]:
        out = []
        for name, fam in self.fams.items():
            for key, (sample_name, value) in self.series[name].items():
                fam.add_sample(sample_name, dict(key), value)
            if fam.samples:
                out.append(fam)
        return out


def refuse(budget: SeriesBudget, logged: set[tuple[str, str]], name: str, reason: str) -> None:
    """Count a refused series; log each (family, reason) once per scrape, not once per series."""
    budget.refused[(name, reason)] += 1
    if (name, reason) not in logged:
        logged.add((name, reason))
        log.warning("exporter refused series of %s (%s)", name, reason)


def exposed_name(name: str, mtype: str) -> str:
    return f"{name}_total" if mtype == "counter" else name


def _labels(sample: Sample, node: str | None) -> dict[str, str]:
    r = sample.reading
    labels: dict[str, str] = {}
    if node is not None:
        labels["node"] = node
    if r.device:
        labels[DEVICE_LABEL.get(r.source, "device")] = r.device
    if r.port:
        labels["port"] = r.port
    for k, v in r.labels:
        key = sanitize(k)
        if key not in FREE_TEXT_LABELS and key not in labels:
            labels[key] = v
    return labels


def add_sample(b: SeriesSink, s: Sample, node: str | None) -> None:
    """The exposed series of one sample (0 to 3: value, rate, saturation), named and labelled."""
    r = s.reading
    stem = metric_stem(r.source, r.metric, r.unit)
    labels = _labels(s, node)
    where = f"{r.source} {r.counter}"
    if r.kind is Kind.COUNTER:
        b.add("counter", stem, labels, r.value, f"{where} (normalized to {r.unit or 'count'})")
        if s.rate is not None:
            b.add("gauge", f"{stem}_per_second", labels, s.rate, f"Per-second rate of {where}")
        if s.status is Status.SATURATED:
            sat = {**labels, "source": r.source, "counter": r.counter}
            since = s.since if s.since is not None else s.ts
            b.add("gauge", SATURATED, sat, since, "Since when a counter is clamped at all ones")
    elif r.kind is Kind.GAUGE:
        b.add("gauge", stem, labels, r.value, f"{where} ({r.unit or 'level'})")
    elif r.kind is Kind.INFO:
        name = stem if stem.endswith("_info") else f"{stem}_info"
        b.add("gauge", name, labels, 1.0, f"{where} attributes (value 1)")
    elif r.kind is Kind.EVENT:
        b.add("gauge", f"{stem}_last_timestamp_seconds", labels, s.ts, f"Event time of the last {where}")


def sample_values(s: Sample) -> list[float]:
    """The values ``add_sample`` gives its series, in the same order: what changes between scrapes of
    one series (the names and labels do not, so the central caches them; see ``fabricd.exposition_text``)."""
    r = s.reading
    if r.kind is Kind.COUNTER:
        values = [r.value]
        if s.rate is not None:
            values.append(s.rate)
        if s.status is Status.SATURATED:
            values.append(s.since if s.since is not None else s.ts)
        return values
    if r.kind is Kind.GAUGE:
        return [r.value]
    if r.kind is Kind.INFO:
        return [1.0]
    if r.kind is Kind.EVENT:
        return [s.ts]
    return []


def families(samples: Iterable[Sample], node: str | None = None, *, budget: SeriesBudget | None = None) -> list[Metric]:
    """The metric families for one node's samples (``node`` becomes a label when given)."""
    return fleet_families([(node, samples)], budget)


def fleet_families(
    by_node: Iterable[tuple[str | None, Iterable[Sample]]], budget: SeriesBudget | None = None
) -> list[Metric]:
    """Families for many nodes at once: merged by name, capped per family across the fleet."""
    builder = _Builder(budget or SeriesBudget())
    for node, samples in by_node:
        for s in samples:
            add_sample(builder, s, node)
    return builder.build()


class SamplesCollector(PromCollector):
    """A prometheus_client collector rendering a fixed list of samples (``fabricd collect``)."""

    def __init__(self, samples: Sequence[Sample], node: str | None = None, budget: SeriesBudget | None = None) -> None:
        self.samples = samples
        self.node = node
        self.budget = budget or SeriesBudget()

    def collect(self) -> Iterator[Metric]:
        yield from families(self.samples, self.node, budget=self.budget)
        yield self.budget.refused_family()


def render(samples: Sequence[Sample], node: str | None = None) -> bytes:
    from prometheus_client import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SamplesCollector(samples, node))
    return generate_latest(registry)
