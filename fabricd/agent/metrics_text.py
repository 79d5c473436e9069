"""One node's samples as Prometheus text, from a template kept while the scrape's shape holds.

The agent's ``/metrics`` is scraped like node_exporter's, once per Prometheus interval, so its cost
is paid per node per scrape across the fleet. Building prometheus_client ``Metric`` objects and
letting ``generate_latest`` escape every label again cost ~11 ms per scrape of an 8-HCA node, ten
times reading the counters (docs/benchmarks.md). From one scrape to the next a node exposes the
same series in the same order (the collectors read the same files); only the values change. So
``NodeText`` keeps the whole exposition as one ``%``-template, with names, labels, HELP and TYPE
rendered once, and a scrape only gathers the values in sample order and formats them in C.

The template is rebuilt whenever the shape changes (a series appears or goes, a rate appears after
the first scrape, a counter saturates): names, labels, caps and refusals are then decided by the
same code as the central's fleet text (``fabricd.exposition_text``), so both name series alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from operator import attrgetter, is_
from typing import Any

from fabricd.exposition import SeriesBudget
from fabricd.exposition_text import FleetText, go_float, picker
from fabricd.model import Kind, Sample, Status

_READING, _RATE, _STATUS = attrgetter("reading"), attrgetter("rate"), attrgetter("status")
_VALUE, _SERIES = attrgetter("value"), attrgetter("series")
_NAMED_BY = attrgetter("series", "kind", "unit", "name")  # with labels inside ``series``
_NONE, _SATURATED = repeat(None), repeat(Status.SATURATED)
_INFO = -1  # the slot of an info series: its value is always 1


class NodeText:
    """Renders one node's latest samples; one instance per agent (it caches the template)."""

    def __init__(self, node: str | None, budget: SeriesBudget | None = None) -> None:
        self.node = node
        self.budget = budget or SeriesBudget()
        self.shape: tuple[list[Any], list[bool], list[bool]] = ([], [], [])
        self.template = b""  # ``%a`` per value: repr, as ``str(float)``
        self.slow = b""  # the same with ``%s``, for values already spelled (NaN, +Inf)
        self.pick: Callable[[list[float]], tuple[float, ...]] = lambda _src: ()
        self.events: list[int] = []  # samples whose exposed value is their event time
        self.saturated: list[int] = []  # samples exposing "saturated since"

    def render(self, samples: Sequence[Sample]) -> bytes:
        # Everything per sample is gathered by C loops (map, attrgetter, itemgetter, %): a Python
        # loop over the ~500 samples of an 8-HCA node cost more than the rest of a scrape.
        readings = list(map(_READING, samples))
        if None in map(_SERIES, readings):
            for r in readings:  # the same cache RateEngine fills (fabricd/counters.py)
                if r.series is None:
                    r.series = r.key()
        rates = list(map(_RATE, samples))
        shape = (
            list(map(_NAMED_BY, readings)),
            list(map(is_, rates, _NONE)),
            list(map(is_, map(_STATUS, samples), _SATURATED)),
        )
        if shape != self.shape:
            self._plan(samples)
            self.shape = shape
        src: list[Any] = list(map(_VALUE, readings))
        try:  # counters read as integers: an int formats in a third of a float's time (same sample)
            integral = list(map(int, src))
            if integral == src:
                src = integral
        except (OverflowError, ValueError):  # an infinity or a NaN: formatted below, as floats
            pass
        src += rates
        src += [samples[i].ts for i in self.events]
        src += [_since(samples[i]) for i in self.saturated]
        values = self.pick(src)
        total = sum(values)
        if total - total != 0:  # a NaN or an infinity somewhere: Go's spelling, as generate_latest
            return self.slow % tuple(go_float(v).encode() for v in values)
        # bytes' % finds the next directive with memchr, str's walks every character: on this
        # 110 KB template that halved the formatting (and no encode is left to do).
        return self.template % values

    def _plan(self, samples: Sequence[Sample]) -> None:
        """The template and where each of its slots is read from (``src`` in ``render``): the
        central's text renderer fed with each value's slot instead of the value itself."""
        n = len(samples)
        self.events = [i for i, s in enumerate(samples) if s.reading.kind is Kind.EVENT]
        self.saturated = [
            i for i, s in enumerate(samples) if s.reading.kind is Kind.COUNTER and s.status is Status.SATURATED
        ]
        extra = {i: 2 * n + j for j, i in enumerate(self.events + self.saturated)}
        index = {id(s): i for i, s in enumerate(samples)}

        def slots(s: Sample) -> Sequence[float]:
            i = index[id(s)]
            kind = s.reading.kind
            if kind is Kind.COUNTER:
                return [i] + ([n + i] if s.rate is not None else []) + ([extra[i]] if i in extra else [])
            return [extra[i] if kind is Kind.EVENT else _INFO if kind is Kind.INFO else i]

        families = FleetText(self.budget).families(((self.node, s) for s in samples), slots)
        parts: list[str | None] = []  # escaped text, and None where a value goes
        order: list[int] = []
        for fam in families:
            parts.append(fam.header().replace("%", "%%"))
            for prefix, slot in fam.rows.items():  # a repeated series keeps its last slot
                line = prefix.replace("%", "%%")
                if slot == _INFO:
                    parts.append(line + "1.0\n")
                else:
                    parts += [line, None, "\n"]
                    order.append(int(slot))
        self.template = b"".join(b"%a" if p is None else p.encode() for p in parts)
        self.slow = b"".join(b"%s" if p is None else p.encode() for p in parts)
        self.pick = picker(order)


def _since(s: Sample) -> float:
    return s.ts if s.since is None else s.since
