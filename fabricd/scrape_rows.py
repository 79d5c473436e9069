"""One node's scrape as the store keeps it: its stored rows, and which of them a reader keeps.

The detection loop keeps about a third of each scrape (``fabricd.server.store.records.Keep``).
Building a ``Sample`` for each kept point, and a ``Reading`` for each gauge, only for the engine to
take them apart again, sample by sample, was about half of the detection loop's CPU a sample, with
most of the objects its garbage collections walked (docs/storage.md, "Detection reads stored rows"). A ``ScrapeRows``
is a ``Sequence[Sample]``: a consumer that iterates it gets exactly the samples a list would hold,
built on first use; the detection engine reads the rows through the ``Layout`` instead
(``fabricd.detect.absorb``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fabricd.lazy_samples import LazySamples
from fabricd.model import Reading, Sample, Status

# One stored raw point: series_id, ts, value, rate, status, since (the store's ``PointRow``).
Row = tuple[int, float, float, float | None, str, float | None]
# How a reader reads a kept series' points: a ``Reading`` per point (its value), or the series'
# identity shared as the reading (a counter whose rate alone is read: value 0.0).
BUILD, SHARE = 1, 2
VALUE, RATE = 2, 3  # a row's columns
# Status by its stored text: a dict hit instead of ``Status(text)``'s EnumType.__call__.
STATUSES: dict[str, Status] = {st.value: st for st in Status}


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class Layout:
    """Which rows of a node's batch are kept, in order, each with its series' identity and how it
    is read. Compared by identity: a reader makes one per node and batch shape and reuses it, so a
    consumer may cache what it derives from one while it lives (``fabricd.detect.absorb``)."""

    kept: tuple[int, ...]  # row indices
    entries: tuple[tuple[Reading, int], ...]  # (identity, BUILD | SHARE) for each kept row
    # the kept series' sources: a consumer of one source skips a scrape without building its samples
    sources: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", frozenset(b.source for b, _how in self.entries))


class ScrapeRows(LazySamples):
    """The kept samples of one scrape (every row at event time ``ts``) of one node's batch."""

    __slots__ = ("layout", "rows", "ts")

    def __init__(self, layout: Layout, rows: Sequence[Row], ts: float) -> None:
        self.layout, self.rows, self.ts = layout, rows, ts
        self._built = None

    def _build_samples(self) -> list[Sample]:
        """The samples, as ``plans.deliveries`` builds them."""
        return _build(self.layout, self.rows)

    def __len__(self) -> int:
        return len(self.layout.kept)

    def __repr__(self) -> str:
        return f"ScrapeRows(ts={self.ts}, kept={len(self)} of {len(self.rows)})"


def _build(layout: Layout, rows: Sequence[Row]) -> list[Sample]:
    out: list[Sample] = []
    append, statuses = out.append, STATUSES
    for i, (b, how) in zip(layout.kept, layout.entries, strict=True):
        _sid, ts, value, rate, status, since = rows[i]
        st = statuses.get(status) or Status(status)
        if how == SHARE:
            append(Sample(ts, b, rate, st, since))
        else:
            r = Reading(b.source, b.device, b.port, b.counter, value, b.unit, b.kind, b.labels, b.name)
            append(Sample(ts, r, rate, st, since))
    return out
