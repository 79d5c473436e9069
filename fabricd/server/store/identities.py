"""Series identities by id, cached: the stream and the latest values join their point rows with them.

A series' identity (node, source, device, port, counter, labels, name, unit, kind) never changes
once stored, so both read paths fetch plain point tuples and build ``Reading``s from this cache.
Building ORM entities per row instead cost about 50 us a point, more than ingest itself.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any, cast

from fabricd.model import Kind, Reading
from fabricd.server.store.batchrows import labels_of_json
from fabricd.server.store.records import Committed
from fabricd.server.store.sql import Database

# Series identities kept: ~200 bytes each, so ~200 MB at most.
IDENTITY_CACHE_MAX = 1_000_000
# Distinct readings kept, shared by every node that has the series: a fleet's nodes repeat the same
# few hundred (source, device, port, counter, labels), so this is ~1,000 at 10,000 nodes; a pingmesh
# series names its peer as its device, ~100 more per peer list. Bounded all the same.
READING_CACHE_MAX = 200_000
_CHUNK = 2000  # ids per query: under both drivers' parameter limits

Identity = tuple[str, Reading]  # node, reading with value 0
_SID, _COLUMNS = itemgetter(0), itemgetter(slice(2, None))  # of a ``SeriesRow``: its id; its reading's columns


class Identities:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._cache: dict[int, Identity] = {}
        self._readings = Readings()

    def committed(self, batches: Sequence[Committed]) -> None:
        """The writer's post-commit hook: the series the batches created, as the writer inserted
        them, so that no reader queries a new series back (at 500 nodes that query was a third of
        the detection loop's read on a fleet's first scrape: docs/storage.md). Subscribed before
        the readers that follow the writer, so they find them."""
        cache, readings = self._cache, self._readings.many
        for b in batches:
            if b.series and len(cache) + len(b.series) <= IDENTITY_CACHE_MAX:  # else read when needed
                node = sys.intern(b.node)  # a batch's series are its node's: interned once
                # (sid, node, *the reading's columns): a slice is the key; the entries made in C
                found = readings(list(map(_COLUMNS, b.series)))
                cache.update(zip(map(_SID, b.series), zip(repeat(node), found), strict=False))

    def of(self, ids: set[int]) -> dict[int, Identity]:
        """A mapping that holds every id of ``ids`` that exists; opens a connection only when one
        is not cached yet (rarely: new series)."""
        cache = self._cache
        if ids <= cache.keys():
            return cache
        with self.db.cursor() as cur:
            return self.load(cur, ids)

    def load(self, cur: Any, ids: set[int]) -> dict[int, Identity]:
        """As ``of``, on an open DBAPI cursor."""
        cache, reading = self._cache, self._readings.of
        missing = [sid for sid in ids if sid not in cache]
        if len(cache) + len(missing) > IDENTITY_CACHE_MAX:
            # Bounded memory for a huge fleet: start a new cache (a reader holding the old one keeps
            # its entries) and refill it from the table.
            cache = self._cache = {}
            missing = list(ids)
        for start in range(0, len(missing), _CHUNK):
            cur.execute(*self.db.sql.series_identity(missing[start : start + _CHUNK]))
            for sid, node, *rest in cur.fetchall():  # the columns of ``records.SeriesRow``
                cache[sid] = (sys.intern(node), reading(tuple(rest)))
        return cache


class Readings:
    """One identity ``Reading`` per distinct series identity of the fleet, whatever its node: a
    node's first scrape built 480 of them, 8 % of the service's GIL time at a fleet's start
    (1,000 nodes over HTTP, py-spy), most of them equal to another node's. They are shared as
    readings (``Keep``'s SHARE) and never changed."""

    def __init__(self) -> None:
        self._by_columns: dict[tuple[str, ...], Reading] = {}

    def many(self, columns: list[tuple[str, ...]]) -> list[Reading]:
        """``of`` each, the readings the cache holds found in C: a node's new series are mostly
        another node's (a lookup a series in Python was 5 % of the central's GIL time over a
        fleet's first scrape, py-spy, 1,000 nodes, 2026-12-06)."""
        found = list(map(self._by_columns.get, columns))
        if None in found:
            found = [r if r is not None else self.of(c) for r, c in zip(found, columns, strict=True)]
        return cast(list[Reading], found)

    def of(self, columns: tuple[str, ...]) -> Reading:
        """The reading of the series columns (source, device, port, counter, name, unit, kind, labels)."""
        r = self._by_columns.get(columns)
        if r is None:
            if len(self._by_columns) >= READING_CACHE_MAX:
                self._by_columns.clear()
            r = self._by_columns[columns] = _identity_reading(*columns)
        return r


def _identity_reading(
    source: str, device: str, port: str, counter: str, name: str, unit: str, kind: str, labels: str
) -> Reading:
    # Interned: a fleet repeats the same few hundred names on every node, so the cache stays small.
    i = sys.intern
    return Reading(i(source), i(device), i(port), i(counter), 0.0, i(unit), Kind(kind), labels_of_json(labels), i(name))
