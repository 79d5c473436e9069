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
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import UNDERSCORES, escape_label_name, escape_metric_name
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

    def text(self) -> str:
        exposed = escape_metric_name(exposed_name(self.name, self.type), UNDERSCORES)
        doc = self.documentation.replace("\\", r"\\").replace("\n", r"\n")
        # Below 1e6 (and not NaN) floatToGoString is repr: the common case, formatted without a call.
        lines = [f"{p}{repr(float(v)) if -1e6 < v < 1e6 else _go_float(v)}\n" for p, v in self.rows.items()]
        return f"# HELP {exposed} {doc}\n# TYPE {exposed} {self.type}\n{''.join(lines)}"


class FleetText:
    """Families of the whole fleet with cached series prefixes; one instance per exporter."""

    def __init__(self, budget: SeriesBudget) -> None:
        self.budget = budget
        self.cache: dict[_Key, list[_Part]] = {}

    def families(self, rows: Iterable[tuple[str | None, Sample]]) -> list[TextFamily]:
        """The families of (node, latest sample) rows, capped per family as ``fleet_families``."""
        builder = _TextBuilder(self.budget)
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
            for part, value in zip(parts, sample_values(s), strict=True):
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

    def __init__(self, budget: SeriesBudget) -> None:
        self.budget = budget
        self.cap = budget.limits.max_series_per_family
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


def _go_float(d: float) -> str:
    """prometheus_client's ``floatToGoString``, with the common finite case first."""
    s = repr(float(d))
    if math.isfinite(d):
        dot = s.find(".")
        if d > 0 and dot > 6:  # Go switches to exponents sooner than Python
            mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
            return f"{mantissa}e+{dot - 1:02d}"
        return s
    return "NaN" if math.isnan(d) else ("+Inf" if d > 0 else "-Inf")
