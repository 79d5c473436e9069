"""The central's fleet families rendered as text, with each series' ``name{labels}`` cached.

A 1,000-node fleet is ~480,000 series. Building prometheus_client ``Metric`` objects with a label
dict per sample and letting ``generate_latest`` re-escape every label on every scrape costs ~40 us a
series (~20 s a scrape, past Prometheus's default 10 s scrape timeout). Names and labels of a
series do not change between scrapes, only its values do, so ``FleetText`` keeps each series'
rendered line prefix (keyed by everything it is named from) and a scrape formats only the values.

Everything else is ``fabricd.exposition``'s: names and labels come from ``add_sample`` (recorded
once per series), values from ``sample_values``, caps and refusals from ``SeriesBudget`` with the
same checks in the same order as ``_Builder``. The cache keeps only the series of the last scrape,
so a series that went stale or was deleted leaves it (and the output) at the next scrape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import UNDERSCORES, escape_label_name, escape_metric_name
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample as PromSample

from fabricd import catalogue
from fabricd.exposition import SeriesBudget, add_sample, exposed_name, refuse, sample_values
from fabricd.model import Sample, Status

_Key = tuple[Any, ...]


class _Part:
    """One exposed series of a reading: its family, type, labels and rendered ``name{labels} ``."""

    __slots__ = ("doc", "exposed", "family", "labels", "mtype", "prefix", "too_long")

    def __init__(self, mtype: str, family: str, labels: Mapping[str, str], doc: str, max_len: int) -> None:
        self.family, self.mtype, self.doc = family, mtype, doc
        self.exposed = exposed_name(family, mtype)
        self.labels = tuple(sorted(labels.items()))  # generate_latest sorts labels the same way
        self.prefix = _line_prefix(self.exposed, self.labels)  # also the series' key within its family
        self.too_long = any(len(v) > max_len for _k, v in self.labels)


class _Recorder:
    """A ``SeriesSink`` that keeps the names and labels ``add_sample`` gives, not the values."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.parts: list[_Part] = []

    def add(self, mtype: str, name: str, labels: Mapping[str, str], value: float, doc: str) -> None:
        self.parts.append(_Part(mtype, name, labels, doc, self.max_len))


class TextFamily(Metric):
    """A fleet family whose text ``FleetText`` renders itself; ``samples`` are built only when a
    prometheus_client consumer asks (``generate_latest`` on the registry, ``get_sample_value``)."""

    def __init__(self, name: str, documentation: str, typ: str) -> None:
        self.rows: dict[str, float] = {}  # line prefix -> value, in first-seen order
        self.parts: dict[str, _Part] = {}
        super().__init__(name, documentation, typ)

    @property
    def samples(self) -> list[PromSample]:
        return [PromSample(self.parts[p].exposed, dict(self.parts[p].labels), v) for p, v in self.rows.items()]

    @samples.setter
    def samples(self, value: list[PromSample]) -> None:
        if value:  # Metric.__init__ sets []; samples of this family come from ``rows`` only
            raise TypeError("TextFamily samples are added by FleetText, not assigned")

    def header(self) -> str:
        """The family's ``# HELP`` and ``# TYPE`` lines."""
        exposed = escape_metric_name(exposed_name(self.name, self.type), UNDERSCORES)
        doc = self.documentation.replace("\\", r"\\").replace("\n", r"\n")
        return f"# HELP {exposed} {doc}\n# TYPE {exposed} {self.type}\n"

    def text(self) -> str:
        # Below 1e6 (and not NaN) floatToGoString is repr: the common case, formatted without a call.
        lines = [f"{p}{repr(float(v)) if -1e6 < v < 1e6 else go_float(v)}\n" for p, v in self.rows.items()]
        return self.header() + "".join(lines)


class FleetText:
    """Families of the whole fleet with cached series prefixes; one instance per exporter."""

    def __init__(self, budget: SeriesBudget) -> None:
        self.budget = budget
        self.cache: dict[_Key, list[_Part]] = {}

    def families(
        self,
        rows: Iterable[tuple[str | None, Sample]],
        values: Callable[[Sample], Sequence[float]] = sample_values,
        max_series: int | None = None,
    ) -> list[TextFamily]:
        """The families of (node, latest sample) rows, capped per family as ``fleet_families``
        and, with ``max_series``, in total (refused as ``fleet_cap``). ``values`` gives each
        sample's exposed values (the agent's ``NodeText`` passes positions)."""
        builder = _TextBuilder(self.budget, max_series)
        cache, add = self.cache, builder.add
        seen: dict[_Key, list[_Part]] = {}
        for node, s in rows:
            r = s.reading  # the key: everything add_sample names the series from, and which exist
            key = (
                node,
                r.source,
                r.device,
                r.port,
                r.counter,
                r.unit,
                r.kind,
                r.labels,
                r.name,
                s.rate is not None,
                s.status is Status.SATURATED,
            )
            parts = seen[key] = cache.get(key) or self._parts(node, s)
            for part, value in zip(parts, values(s), strict=True):
                add(part, value)
        self.cache = seen  # drop series not in this scrape: stale, deleted or renamed
        return [fam for fam in builder.fams.values() if fam.rows]

    def _parts(self, node: str | None, s: Sample) -> list[_Part]:
        recorder = _Recorder(self.budget.limits.max_label_value_length)
        add_sample(recorder, s, node)
        return recorder.parts


class _TextBuilder:
    """``exposition._Builder``'s checks (type conflict, label length, family cap, last value wins)
    on cached parts: one name never gets two types, a series never appears twice."""

    def __init__(self, budget: SeriesBudget, max_series: int | None = None) -> None:
        self.budget = budget
        self.cap = budget.limits.max_series_per_family
        self.left = max_series if max_series is not None else -1  # series the total cap still allows
        self.fams: dict[str, TextFamily] = {}
        self.owner: dict[str, str] = {}  # exposed sample name -> family name
        self.logged: set[tuple[str, str]] = set()

    def add(self, part: _Part, value: float) -> None:
        fam = self.fams.get(part.family)
        if fam is None:
            if self.owner.setdefault(part.exposed, part.family) != part.family:
                return refuse(self.budget, self.logged, part.family, "type_conflict")
            doc = catalogue.help_for(part.exposed) or part.doc
            fam = self.fams[part.family] = TextFamily(part.family, doc, part.mtype)
        if fam.type != part.mtype:
            return refuse(self.budget, self.logged, part.family, "type_conflict")
        if part.too_long:
            return refuse(self.budget, self.logged, part.family, "label_too_long")
        rows = fam.rows
        if part.prefix not in rows:
            if len(rows) >= self.cap:
                return refuse(self.budget, self.logged, part.family, "family_cap")
            if self.left == 0:
                return refuse(self.budget, self.logged, part.family, "fleet_cap")
            self.left -= 1
            fam.parts[part.prefix] = part
        rows[part.prefix] = value  # a repeat of a series: the last value wins
        return None


def _line_prefix(exposed: str, labels: tuple[tuple[str, str], ...]) -> str:
    """``name{k="v",...} `` escaped exactly as prometheus_client's ``generate_latest`` does."""
    name = escape_metric_name(exposed, UNDERSCORES)
    if not labels:
        return f"{name} "
    inner = ",".join(f'{escape_label_name(k, UNDERSCORES)}="{_escape_value(v)}"' for k, v in labels)
    return f"{name}{{{inner}}} "


def _escape_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def go_float(d: float) -> str:
    """prometheus_client's ``floatToGoString``, with the common finite case first."""
    s = repr(float(d))
    if math.isfinite(d):
        dot = s.find(".")
        if d > 0 and dot > 6:  # Go switches to exponents sooner than Python
            mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
            return f"{mantissa}e+{dot - 1:02d}"
        return s
    return "NaN" if math.isnan(d) else ("+Inf" if d > 0 else "-Inf")


# prometheus_client's munging of OpenMetrics types into the text format 0.0.4 (``generate_latest``).
_TEXT_TYPE = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")


class RegistryText:
    """``generate_latest``'s text for already collected ``Metric`` families (the agent's own
    counters), with each family's lines kept as a template while its series stay the same:
    ``generate_latest`` escapes and formats every line again, ~9 us a series (0.46 ms for the
    agent's 42, more than rendering its 883 sample series from a template)."""

    def __init__(self, const_labels: Mapping[str, str] | None = None) -> None:
        # Labels added to every sample that lacks them (the agent's ``node``).
        self.const_labels = dict(const_labels or {})
        # family name -> (its samples' names and labels, type and HELP, template, slot order)
        self.cache: dict[str, _Family] = {}

    def render(self, metrics: Iterable[Metric]) -> str:
        out: list[str] = []
        seen: dict[str, _Family] = {}
        for metric in metrics:
            samples = metric.samples
            names_labels = list(map(_NAME_LABELS, samples))  # compared as is: C-level, no key built
            fam = self.cache.get(metric.name)
            if fam is None or fam.names_labels != names_labels or fam.about != (metric.type, metric.documentation):
                fam = _Family(metric, names_labels, self.const_labels)
            seen[metric.name] = fam
            if fam.pick is None:  # a sample with its own timestamp: never in fabricd's own metrics
                out.append(generate_text([metric]))
                continue
            values = fam.pick(list(map(_SAMPLE_VALUE, samples)))
            total = sum(values)
            if total - total != 0:  # a NaN or an infinity: Go's spelling, as generate_latest
                out.append(fam.template % tuple(map(go_float, values)))
            else:
                out.append(fam.template % values)
        self.cache = seen
        return "".join(out)


_NAME_LABELS, _SAMPLE_VALUE = itemgetter(0, 1), itemgetter(2)  # prometheus_client Sample fields


class _Family:
    __slots__ = ("about", "names_labels", "pick", "template")

    def __init__(self, metric: Metric, names_labels: list[Any], const_labels: Mapping[str, str]) -> None:
        self.names_labels = names_labels
        self.about = (metric.type, metric.documentation)
        self.template, order = _family_template(metric, const_labels)
        self.pick: Callable[[list[float]], tuple[float, ...]] | None = picker(order)
        if any(s.timestamp is not None for s in metric.samples):
            self.pick = None


def picker(order: list[int]) -> Callable[[list[float]], tuple[float, ...]]:
    """A C-speed gather of ``src[order[0]], src[order[1]], ...`` as a tuple, for ``%``."""
    if len(order) > 1:
        return itemgetter(*order)
    return lambda src: tuple(src[i] for i in order)


def generate_text(metrics: list[Metric]) -> str:
    from prometheus_client import generate_latest

    class _Fixed(Collector):
        def collect(self) -> Iterable[Metric]:
            return metrics

    return generate_latest(_Fixed()).decode()


def _family_template(metric: Metric, const_labels: Mapping[str, str]) -> tuple[str, list[int]]:
    """One family's text with ``%s`` for each sample's value, and the sample index filling each
    slot: the OpenMetrics-only samples (``_created``...) move to gauge families of their own after
    the family, as ``generate_latest`` moves them, so the slots are not in sample order."""
    name = metric.name + ("_total" if metric.type == "counter" else "_info" if metric.type == "info" else "")
    doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n").replace("%", "%%")
    main = [_header(name, doc, _TEXT_TYPE.get(metric.type, metric.type))]
    order: list[int] = []
    extra: dict[str, list[tuple[int, str]]] = {}
    for i, s in enumerate(metric.samples):
        labels = {**const_labels, **s.labels}
        line = _line_prefix(s.name, tuple(sorted(labels.items()))).replace("%", "%%") + "%s\n"
        suffix = next((x for x in _OM_SUFFIXES if s.name == metric.name + x), None)
        if suffix is None:
            main.append(line)
            order.append(i)
        else:
            extra.setdefault(suffix, []).append((i, line))
    for suffix, lines in sorted(extra.items()):
        main.append(_header(metric.name + suffix, doc, "gauge"))
        for i, line in lines:
            main.append(line)
            order.append(i)
    return "".join(main), order


def _header(exposed: str, doc: str, mtype: str) -> str:
    name = escape_metric_name(exposed, UNDERSCORES).replace("%", "%%")
    return f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n"
