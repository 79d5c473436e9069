"""A decoded batch's samples as columns: what the central's ingest reads, without a sample object.

Ingest decoded every row into a ``Reading`` and a ``Sample``, with a type check a field, and then
took them apart again field by field: series ids from five attributes, point rows from six, the
limits from seven strings. At 480 samples a batch that was 3.0-3.5 µs of a replica's 7.3-7.8 µs a
sample (bench/pipeline.py's decode stage, in the slow phase of the bench machine on 2026-12-06),
the largest of its stages. ``columns_of`` turns the msgpack/JSON rows into one tuple per field
(``zip(*rows)``, in C) and checks each column as a whole (its types, finiteness, enums), which
costs a fraction of a row-by-row pass; ``SampleColumns`` is then a ``Sequence[Sample]`` whose
samples are built only if a consumer iterates it (as ``fabricd.scrape_rows.ScrapeRows`` does for
stored rows), while the store's hot paths read its columns (``fabricd/server/store/batchrows.py``).

It accepts exactly what ``wire._samples_from_rows``'s fast path accepts unchanged: 13-item lists
of exact ``str``/``float`` fields, a known kind and status, finite numbers, labels null or an
object of strings. For anything else ``columns_of`` says None and the rows take the row path,
which converts what converts and raises the error that names the field: one answer either way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from itertools import compress
from typing import Any

from fabricd.lazy_samples import LazySamples
from fabricd.model import Kind, Labels, Reading, Sample, Status

# Enum lookups by value: a dict hit costs a fraction of ``Kind(x)``'s call into EnumType.__call__.
KINDS: dict[str, Kind] = {k.value: k for k in Kind}
STATUSES: dict[str, Status] = {s.value: s for s in Status}
STATUS_TEXT: dict[str, str] = {s.value: s.value for s in Status}  # the enum's own string objects
FLOAT: frozenset[type] = frozenset({float})
OPTIONAL_FLOAT: frozenset[type] = frozenset({float, type(None)})
_NO_LABELS: frozenset[type] = frozenset({type(None)})


# The wire's sample row, field by field (``wire.SAMPLE_FIELDS``); a ``SampleColumns`` attribute each.
SAMPLE_FIELDS = (
    "ts",
    "source",
    "device",
    "port",
    "counter",
    "name",
    "unit",
    "kind",
    "labels",
    "value",
    "rate",
    "status",
    "since",
)


class SampleColumns(LazySamples):
    """One batch's samples, a tuple per wire field (``SAMPLE_FIELDS``), in the wire's row order;
    labels as sorted item tuples, as ``Reading.labels``."""

    __slots__ = (*SAMPLE_FIELDS, "_sources")
    ts: tuple[float, ...]
    source: tuple[str, ...]
    device: tuple[str, ...]
    port: tuple[str, ...]
    counter: tuple[str, ...]
    name: tuple[str, ...]
    unit: tuple[str, ...]
    kind: tuple[str, ...]
    labels: tuple[Labels, ...]
    value: tuple[float, ...]
    rate: tuple[float | None, ...]
    status: tuple[str, ...]
    since: tuple[float | None, ...]

    def __init__(self, columns: Sequence[tuple[Any, ...]]) -> None:
        for field, column in zip(SAMPLE_FIELDS, columns, strict=True):
            setattr(self, field, column)
        self._built = None
        self._sources: frozenset[str] | None = None

    @property
    def columns(self) -> tuple[tuple[Any, ...], ...]:
        return tuple(getattr(self, field) for field in SAMPLE_FIELDS)

    @property
    def sources(self) -> frozenset[str]:
        """The samples' sources (three consumers a batch ask: computed once)."""
        if self._sources is None:
            self._sources = frozenset(self.source)
        return self._sources

    def identities(self) -> Iterator[tuple[str, str, str, str, Labels]]:
        """Each sample's series identity within its node (``Reading.key()``), in order."""
        return zip(self.source, self.device, self.port, self.counter, self.labels, strict=True)

    def where(self, keep: Iterable[bool]) -> SampleColumns:
        """The samples whose ``keep`` is true, as columns."""
        mask = list(keep)
        return SampleColumns([tuple(compress(column, mask)) for column in self.columns])

    def _build_samples(self) -> list[Sample]:
        """The samples, as the row path builds them."""
        kinds, statuses = KINDS, STATUSES
        return [
            Sample(ts, Reading(src, dev, port, ctr, value, unit, kinds[kind], labels, name), rate, statuses[st], since)
            for ts, src, dev, port, ctr, name, unit, kind, labels, value, rate, st, since in zip(
                *self.columns, strict=True
            )
        ]

    def __len__(self) -> int:
        return len(self.ts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SampleColumns):
            return self.columns == other.columns
        return isinstance(other, list) and self.samples() == other

    __hash__ = None  # type: ignore[assignment]  # compared by value, as the list it stands for

    def __repr__(self) -> str:
        return f"SampleColumns({len(self)} samples)"


def columns_of(rows: list[Any]) -> SampleColumns | None:
    """The rows as columns if every one is well formed as the fast path takes it; else None."""
    if not rows:
        return None
    try:
        # The transpose in C. A row that is not a 13-item list fails it (ValueError) or puts a
        # string's characters, a byte string's ints or an object's keys in the float columns.
        ts, source, device, port, counter, name, unit, kind, labels, value, rate, status, since = zip(
            *rows, strict=True
        )
        if not (
            _exactly(FLOAT, ts, value)
            and _exactly(OPTIONAL_FLOAT, rate, since)
            and _strings(source, device, port, counter, name, unit)
            and KINDS.keys() >= set(kind)
            and STATUSES.keys() >= set(status)
            and _finite(ts)
            and _finite(value)
            and _finite(filter(None, rate))
            and _finite(filter(None, since))
        ):
            return None
    except (TypeError, ValueError):  # not 13 items; a list or an object where a string is due
        return None
    sorted_labels = _labels(labels)
    if sorted_labels is None:
        return None
    # ``or 0.0`` as the row path does (it turns -0.0 into 0.0).
    ts_out = tuple([t or 0.0 for t in ts])
    value_out = tuple([v or 0.0 for v in value])
    # Each status as the one string its enum holds (``Status.value``), as the row path's point rows
    # carry it: the stored rows outlive the batch (the latest values, the tail), and a decoded
    # string per row kept alive, and freed when replaced, cost the writer's listeners half again.
    statuses = tuple(map(STATUS_TEXT.__getitem__, status))
    return SampleColumns(
        (ts_out, source, device, port, counter, name, unit, kind, sorted_labels, value_out, rate, statuses, since)
    )


def _exactly(types: frozenset[type], *columns: Sequence[Any]) -> bool:
    return all(set(map(type, column)) <= types for column in columns)


def _strings(*columns: Sequence[Any]) -> bool:
    """Every item of ``columns`` a string: ``str.join`` refuses anything else (TypeError), at a
    fraction of a type check an item. Decoded JSON and msgpack hold no ``str`` subclass."""
    for column in columns:
        "".join(column)
    return True


def _finite(values: Iterable[float]) -> bool:
    """No NaN or infinity among ``values`` (floats): their sum is finite. A sum that overflows
    says no too, and those rows take the row path, which checks them one by one."""
    return math.isfinite(sum(values, 0.0))


def _labels(column: Sequence[Any]) -> tuple[Labels, ...] | None:
    """Each row's labels as ``Reading.labels`` (sorted items); None if one is not null or an
    object of strings."""
    if set(map(type, column)) == _NO_LABELS:
        return ((),) * len(column)
    out: list[Labels] = []
    for labels in column:
        plain = () if labels is None else plain_labels(labels)
        if plain is None:
            return None
        out.append(plain)
    return tuple(out)


def plain_labels(val: Any) -> Labels | None:
    """An object of strings as ``Reading.labels`` (sorted items); None for anything else."""
    if type(val) is dict and all(type(k) is str and type(v) is str for k, v in val.items()):
        return tuple(sorted(val.items()))
    return None
