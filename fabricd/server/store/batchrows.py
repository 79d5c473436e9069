"""A batch as the rows ingest writes: series keys, label JSON, point and health rows (pure).

The writer's hot loops live here at module level, so they avoid attribute lookups on ``self``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from fabricd.model import CollectorHealth, Labels, Reading, Sample
from fabricd.server.store.records import PointRow
from fabricd.wire_columns import SampleColumns

SeriesKey = tuple[str, str, str, str, str, str]  # node, source, device, port, counter, labels JSON
IdentityKey = tuple[str, str, str, str, Labels]  # source, device, port, counter, labels: one node's series


@functools.lru_cache(maxsize=65_536)
def labels_json(labels: tuple[tuple[str, str], ...]) -> str:
    """Canonical JSON of a label tuple (cached: a fleet has few distinct label sets)."""
    return json.dumps(dict(labels), sort_keys=True, separators=(",", ":")) if labels else "{}"


def labels_of_json(text: str) -> Labels:
    return tuple(sorted(json.loads(text).items())) if text != "{}" else ()


def series_key(node: str, r: Reading) -> SeriesKey:
    return (node, r.source, r.device, r.port, r.counter, labels_json(r.labels))


def alias(ids: dict[IdentityKey, int], r: Reading) -> bool:
    """Map an unsorted (or repeated-key) label tuple to its stored series, if there is one."""
    if len(r.labels) < 2:  # none or one: already canonical, and the caller has just missed it
        return False
    canonical = tuple(sorted(dict(r.labels).items()))
    sid = ids.get((r.source, r.device, r.port, r.counter, canonical))
    if sid is None:
        return False
    ids[(r.source, r.device, r.port, r.counter, r.labels)] = sid
    return True


def series_ids(samples: Sequence[Sample], ids: dict[IdentityKey, int]) -> list[int | None]:
    get = ids.get
    if isinstance(samples, SampleColumns):  # the identities' tuples and the lookups in C
        return list(map(get, samples.identities()))
    return [get((r.source, r.device, r.port, r.counter, r.labels)) for s in samples for r in [s.reading]]


def point_rows(samples: Sequence[Sample], sids: list[int]) -> list[PointRow]:
    if isinstance(samples, SampleColumns):  # the status column holds the statuses' texts
        return list(zip(sids, samples.ts, samples.value, samples.rate, samples.status, samples.since, strict=True))
    # ``_value_``: the enum's plain str (``.value`` is a descriptor call, several times slower).
    return [
        (sid, s.ts, s.reading.value, s.rate, s.status._value_, s.since) for sid, s in zip(sids, samples, strict=True)
    ]


def health_rows(node: str, health: Sequence[CollectorHealth]) -> list[tuple[Any, ...]]:
    """One row per collector: its newest report in the batch."""
    latest: dict[str, CollectorHealth] = {}
    for h in health:
        if h.collector not in latest or h.ts >= latest[h.collector].ts:
            latest[h.collector] = h
    return [
        (node, h.collector, h.success, h.duration_seconds, h.ts, h.error[:2000], h.readings) for h in latest.values()
    ]
