"""A batch as the rows ingest writes: series keys, label JSON, point and health rows (pure).

The writer's hot loops live here at module level, so they avoid attribute lookups on ``self``.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any, NamedTuple

from fabricd.model import CollectorHealth, Labels, Sample
from fabricd.server.store.records import PointRow
from fabricd.server.store.sql import PointColumns
from fabricd.wire_columns import SampleColumns

SeriesKey = tuple[str, str, str, str, str, str]  # node, source, device, port, counter, labels JSON
IdentityKey = tuple[str, str, str, str, Labels]  # source, device, port, counter, labels: one node's series


@functools.lru_cache(maxsize=65_536)
def labels_json(labels: tuple[tuple[str, str], ...]) -> str:
    """Canonical JSON of a label tuple (cached: a fleet has few distinct label sets)."""
    return json.dumps(dict(labels), sort_keys=True, separators=(",", ":")) if labels else "{}"


def labels_of_json(text: str) -> Labels:
    return tuple(sorted(json.loads(text).items())) if text != "{}" else ()


def alias(ids: dict[IdentityKey, int], key: IdentityKey) -> bool:
    """Map an unsorted (or repeated-key) label tuple to its stored series, if there is one."""
    source, device, port, counter, labels = key
    if len(labels) < 2:  # none or one: already canonical, and the caller has just missed it
        return False
    sid = ids.get((source, device, port, counter, tuple(sorted(dict(labels).items()))))
    if sid is None:
        return False
    ids[key] = sid
    return True


Described = tuple[str, str, str]  # a series' metric name, unit and kind


def unresolved(samples: Sequence[Sample], sids: list[int | None]) -> Iterator[tuple[IdentityKey, Described]]:
    """The series identity, metric name, unit and kind of each sample that has no series id: what
    a new series row holds. From a decoded batch's columns without building its samples (a
    node's first scrape built 480 only for this: 5 % of the central's GIL time, py-spy)."""
    missing = [sid is None for sid in sids]
    if isinstance(samples, SampleColumns):
        new = samples if all(missing) else samples.where(missing)  # all of a node's first scrape
        metrics = [name or counter for name, counter in zip(new.name, new.counter, strict=True)]
        return zip(new.identities(), zip(metrics, new.unit, new.kind, strict=True), strict=True)
    readings = [s.reading for s, m in zip(samples, missing, strict=True) if m]
    return ((r.key(), (r.metric, r.unit, r.kind.value)) for r in readings)


def series_ids(samples: Sequence[Sample], ids: dict[IdentityKey, int]) -> list[int | None]:
    get = ids.get
    if isinstance(samples, SampleColumns):  # the identities' tuples and the lookups in C
        return list(map(get, samples.identities()))
    return [get((r.source, r.device, r.port, r.counter, r.labels)) for s in samples for r in [s.reading]]


class FirstScrape(NamedTuple):
    """A batch whose every sample is a new series (``first_scrape``), as the writer inserts it."""

    keys: list[IdentityKey]  # each sample's identity, in order
    rows: list[tuple[str, ...]]  # the series rows: node, identity with label JSON, metric, unit, kind
    # source, device, port, counter, metric, unit, kind, label JSON: a ``SeriesRow`` after id and node
    columns: tuple[Sequence[str], ...]


def first_scrape(node: str, samples: Sequence[Sample], sids: list[int | None]) -> FirstScrape | None:
    """The new series of a decoded batch whose every sample is a series the node does not have,
    each once (a node's first scrape), built column by column in C; None for any other batch (the
    writer's general path: repeats, a mix of known and new series, a list of samples)."""
    if not isinstance(samples, SampleColumns) or sids.count(None) != len(sids):
        return None
    keys = list(samples.identities())
    if len(set(keys)) != len(keys):
        return None
    n = len(keys)
    # Decoded labels are sorted (``wire_columns``): the batch's keys are the stored identities.
    labels: Sequence[str] = list(map(labels_json, samples.labels)) if any(samples.labels) else ("{}",) * n
    metrics = (
        samples.name
        if "" not in samples.name
        else [name or c for name, c in zip(samples.name, samples.counter, strict=True)]
    )
    rows = list(
        zip(
            repeat(node, n),
            samples.source,
            samples.device,
            samples.port,
            samples.counter,
            labels,
            metrics,
            samples.unit,
            samples.kind,
            strict=True,
        )
    )
    columns = (
        samples.source,
        samples.device,
        samples.port,
        samples.counter,
        metrics,
        samples.unit,
        samples.kind,
        labels,
    )
    return FirstScrape(keys, rows, columns)


# A decoded batch's series identity columns: source, device, port, counter, sorted labels.
Shape = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[Labels, ...]]


def shape_of(samples: Sequence[Sample]) -> Shape | None:
    """The identity columns of a decoded batch (None for a list of samples). An agent sends the
    same series in the same order every scrape, so a node's batches mostly share one shape: the
    writer compares it with the node's last one (string compares in C) and reuses those series
    ids, instead of hashing a 5-tuple and probing the node's dict for every sample (13 % of the
    central's GIL time at 480 samples a batch, py-spy, 2026-12-06)."""
    if isinstance(samples, SampleColumns):
        return (samples.source, samples.device, samples.port, samples.counter, samples.labels)
    return None


@functools.lru_cache(maxsize=1024)
def kept_shape(shape: Shape) -> Shape:
    """``shape`` with its strings interned, to be kept for a node: the batch's decoded strings
    are its own objects (from wire version 2 one a sample and field, ~100 KB a node at 480
    samples; from version 3 one a distinct string); interned, every node shares them. Cached: the
    nodes of a fleet mostly send one shape, so they share one tuple too (19 KB a node kept
    otherwise), and a node's first scrape interns nothing (4 % of the central's GIL time over a
    fleet's first scrape, py-spy, 2026-12-06)."""
    intern = sys.intern
    source, device, port, counter = (tuple(map(intern, column)) for column in shape[:4])
    labels = shape[4]
    if any(labels):
        labels = tuple(tuple((intern(k), intern(v)) for k, v in items) for items in labels)
    return (source, device, port, counter, labels)


def point_rows(samples: Sequence[Sample], sids: Sequence[int]) -> list[PointRow]:
    if isinstance(samples, SampleColumns):  # the status column holds the statuses' texts
        return list(zip(sids, samples.ts, samples.value, samples.rate, samples.status, samples.since, strict=True))
    # ``_value_``: the enum's plain str (``.value`` is a descriptor call, several times slower).
    return [
        (sid, s.ts, s.reading.value, s.rate, s.status._value_, s.since) for sid, s in zip(sids, samples, strict=True)
    ]


def point_columns(samples: Sequence[Sample], sids: Sequence[int]) -> PointColumns | None:
    """The point rows' columns, where the batch holds them already (a decoded batch's)."""
    if isinstance(samples, SampleColumns):
        return (sids, samples.ts, samples.value, samples.rate, samples.status, samples.since)
    return None


def health_rows(node: str, health: Sequence[CollectorHealth]) -> list[tuple[Any, ...]]:
    """One row per collector: its newest report in the batch."""
    latest: dict[str, CollectorHealth] = {}
    for h in health:
        if h.collector not in latest or h.ts >= latest[h.collector].ts:
            latest[h.collector] = h
    return [
        (node, h.collector, h.success, h.duration_seconds, h.ts, h.error[:2000], h.readings) for h in latest.values()
    ]
