"""Prometheus names and exposition for fabricd samples (agent ``collect`` and the central exporter).

Naming per Prometheus conventions (https://prometheus.io/docs/practices/naming/):
``fabricd_<source>_<name>[_<unit>]_total`` for counters (value normalized to base units),
``..._per_second`` gauges for the agent-computed rates (wraps, resets and saturation handled, which
``rate()`` over a raw counter cannot do), plain gauges for levels, ``_info`` gauges for strings.
Labels are few and stable: ``node``, ``device``, ``port`` and the reading's own (``priority``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PromCollector
from prometheus_client.registry import CollectorRegistry

from fabricd.model import Kind, Sample, Status

_BAD = re.compile(r"[^a-zA-Z0-9_]")
# Units that are already part of the name in base units; "" means a dimensionless count.
_UNIT_SUFFIX = {"bytes", "seconds", "packets", "frames", "ticks", "events", "bytes_per_second", "ratio"}


def sanitize(name: str) -> str:
    name = _BAD.sub("_", name).strip("_").lower()
    return f"_{name}" if name[:1].isdigit() else name


def metric_stem(source: str, name: str, unit: str) -> str:
    """``fabricd_<source>_<name>_<unit>`` without the type suffix."""
    stem = f"fabricd_{sanitize(source)}_{sanitize(name)}"
    unit = sanitize(unit)
    if unit and unit in _UNIT_SUFFIX and not stem.endswith(f"_{unit}"):
        stem = f"{stem}_{unit}"
    return stem


def _label_pairs(sample: Sample, node: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    r = sample.reading
    pairs: list[tuple[str, str]] = []
    if node is not None:
        pairs.append(("node", node))
    if r.device:
        pairs.append(("device", r.device))
    if r.port:
        pairs.append(("port", r.port))
    pairs.extend((sanitize(k), v) for k, v in r.labels)
    return tuple(k for k, _ in pairs), tuple(v for _, v in pairs)


class _Families:
    """Metric families keyed by (name, label names) so one name never mixes label sets."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, str], Metric] = {}

    def add(self, kind: str, name: str, doc: str, labels: tuple[tuple[str, ...], tuple[str, ...]],
            value: float) -> None:  # fmt: skip
        names, values = labels
        fam = self.by_key.get((name, kind))
        if fam is None:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            fam = cls(name, doc, labels=list(names))
            self.by_key[(name, kind)] = fam
        if list(names) != list(getattr(fam, "_labelnames", names)):
            return  # a label set this family does not have: skip rather than emit invalid exposition
        fam.add_metric(list(values), value)  # type: ignore[attr-defined]


def families(samples: Iterable[Sample], node: str | None = None) -> list[Metric]:
    fams = _Families()
    for s in samples:
        r = s.reading
        stem = metric_stem(r.source, r.metric, r.unit)
        labels = _label_pairs(s, node)
        where = f"{r.source} {r.counter}"
        if r.kind is Kind.COUNTER:
            fams.add("counter", stem, f"{where} (normalized to {r.unit or 'count'})", labels, r.value)
            if s.rate is not None:
                fams.add("gauge", f"{stem}_per_second", f"Per-second rate of {where}", labels, s.rate)
            if s.status is Status.SATURATED:
                sat = (labels[0] + ("counter",), labels[1] + (r.counter,))
                fams.add("gauge", "fabricd_counter_saturated", "1 while a counter is clamped at all ones",
                         sat, 1.0)  # fmt: skip
        elif r.kind is Kind.GAUGE:
            fams.add("gauge", stem, f"{where} ({r.unit or 'level'})", labels, r.value)
        elif r.kind is Kind.INFO:
            fams.add("gauge", f"{stem}_info", f"{where} attributes", labels, 1.0)
    return list(fams.by_key.values())


class SamplesCollector(PromCollector):
    """A prometheus_client collector rendering a fixed list of samples (``fabricd collect``)."""

    def __init__(self, samples: Sequence[Sample], node: str | None = None) -> None:
        self.samples = samples
        self.node = node

    def collect(self) -> Iterator[Metric]:
        yield from families(self.samples, self.node)


def render(samples: Sequence[Sample], node: str | None = None) -> bytes:
    from prometheus_client import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SamplesCollector(samples, node))
    return generate_latest(registry)
