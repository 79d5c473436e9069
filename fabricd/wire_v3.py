"""Wire version 3: a batch's samples as columns, their strings in one table (docs/wire-format.md).

Versions 1 and 2 carry a sample as a 13-field row. An agent's batch repeats the same few strings
in every row (``infiniband``, eight devices, sixty counter names), and the central decoded each
occurrence into a string of its own, then transposed the rows into columns and checked those
(``wire_columns.columns_of``): at 480 samples a batch, 1.2-1.6 µs of the central's CPU a sample,
against 0.5-0.65 µs for the same samples as index columns into one string table (``wire.decode``
in-process, alternated, 2026-12-06; docs/wire-format.md). msgpack decodes an index below 128 to a
cached small int, so the table's strings are decoded once a batch, and the columns arrive in the
shape the store reads. The body is 2.3 times smaller too (gzip: 951 bytes against 2,236).

    "strings": ["infiniband", "mlx5_0", "1", "port_xmit_data", ...],
    "labels": [null, {"priority": "3"}],
    "columns": {"ts": [...], "source": [0, 0, ...], "device": [1, 1, ...], ..., "labels": [0, 1, ...],
                "value": [...], "rate": [... or null], "status": [...], "since": [... or null]}

Every column has one item a sample. The string columns (``STRING_FIELDS``) hold indices into
``strings``, the ``labels`` column indices into ``labels`` (null or an object of strings); the
others are numbers. Decoding checks each column whole (types, finiteness, ranges, kinds and
statuses) and names the first bad item when one is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from fabricd.model import Labels, Sample
from fabricd.wire_columns import FLOAT, KINDS, OPTIONAL_FLOAT, SAMPLE_FIELDS, STATUS_TEXT, SampleColumns, plain_labels
from fabricd.wire_errors import WireError

STRING_FIELDS = ("source", "device", "port", "counter", "name", "unit", "kind", "status")
_STR: frozenset[type] = frozenset({str})


def columns_obj(samples: Sequence[Sample]) -> dict[str, Any]:
    """The ``strings``, ``labels`` and ``columns`` keys of a version 3 batch of ``samples``."""
    ts, source, device, port, counter, name, unit, kind, labels, value, rate, status, since = _columns_of(samples)
    text = dict(zip(STRING_FIELDS, (source, device, port, counter, name, unit, kind, status), strict=True))
    # Each distinct item numbered in order of first use (``dict.fromkeys`` dedupes in C), then
    # every column looked up in C: a Python step per distinct string, not per sample.
    table = {
        x: i for i, x in enumerate(dict.fromkeys(x for field in STRING_FIELDS for x in dict.fromkeys(text[field])))
    }
    sets = {x: i for i, x in enumerate(dict.fromkeys(labels))}
    columns = {field: list(map(table.__getitem__, text[field])) for field in STRING_FIELDS}
    columns.update(
        ts=list(ts),
        labels=list(map(sets.__getitem__, labels)),
        value=list(value),
        rate=list(rate),
        since=list(since),
    )
    return {
        "strings": list(table),
        "labels": [dict(x) if x else None for x in sets],
        "columns": {field: columns[field] for field in SAMPLE_FIELDS},
    }


def _columns_of(samples: Sequence[Sample]) -> Sequence[Sequence[Any]]:
    """The samples' fields as columns, in ``SAMPLE_FIELDS`` order (kinds and statuses as text)."""
    if isinstance(samples, SampleColumns):
        return samples.columns
    readings = [s.reading for s in samples]
    return (
        [s.ts for s in samples],
        *([getattr(r, field) for r in readings] for field in ("source", "device", "port", "counter", "name", "unit")),
        [r.kind._value_ for r in readings],  # the enum's plain str: ``.value`` is a descriptor call
        [r.labels for r in readings],
        [r.value for r in readings],
        [s.rate for s in samples],
        [s.status._value_ for s in samples],
        [s.since for s in samples],
    )


def samples_from_obj(obj: dict[str, Any], columnar: bool) -> Sequence[Sample]:
    """The samples of a version 3 batch object: as ``SampleColumns`` if ``columnar``, else a list."""
    strings, sets, columns = _array(obj, "strings"), _array(obj, "labels"), obj.get("columns")
    if not isinstance(columns, dict):
        raise WireError("field 'columns' must be an object", "columns")
    raw = {field: _column(columns, field) for field in SAMPLE_FIELDS}
    n = len(raw["ts"])
    for field, column in raw.items():
        if len(column) != n:
            raise WireError(f"columns.{field} has {len(column)} items, columns.ts {n}", f"columns.{field}")
    if not n:
        return []
    if not set(map(type, strings)) <= _STR:
        bad = next(i for i, x in enumerate(strings) if type(x) is not str)
        raise WireError(f"strings[{bad}] must be a string", f"strings[{bad}]")
    table = dict(enumerate(strings))
    text = {field: _lookup(raw[field], table, field, "strings") for field in STRING_FIELDS}
    _known(text["kind"], KINDS.keys(), "kind")
    _known(text["status"], STATUS_TEXT.keys(), "status")
    label_sets = {i: _label_set(i, x) for i, x in enumerate(sets)}
    out = SampleColumns(
        (
            _floats(raw["ts"], "ts"),
            *(text[field] for field in STRING_FIELDS[:7]),
            _lookup(raw["labels"], label_sets, "labels", "labels"),
            _floats(raw["value"], "value"),
            _floats(raw["rate"], "rate", optional=True),
            tuple(map(STATUS_TEXT.__getitem__, text["status"])),
            _floats(raw["since"], "since", optional=True),
        )
    )
    return out if columnar else out.samples()


def _array(obj: dict[str, Any], key: str) -> list[Any]:
    val = obj.get(key)
    if not isinstance(val, list):
        raise WireError(f"field {key!r} must be an array", key)
    return val


def _column(columns: dict[str, Any], field: str) -> list[Any]:
    val = columns.get(field)
    if not isinstance(val, list):
        raise WireError(f"columns.{field} must be an array", f"columns.{field}")
    return val


def _lookup(column: list[Any], table: dict[int, Any], field: str, name: str) -> tuple[Any, ...]:
    """Each index of ``column`` replaced by its item of ``table`` (by index), in C: a negative,
    out-of-range or non-integer index is a missing key (an integral float or a boolean finds its
    integer's item). Item by item only to name a bad one."""
    try:
        return itemgetter(*column)(table) if len(column) > 1 else (table[column[0]],)
    except (KeyError, TypeError):  # TypeError: an unhashable index (an array, an object)
        bad = next(i for i, x in enumerate(column) if not _has(table, x))
        raise WireError(f"columns.{field}[{bad}] must be an index into {name!r}", f"columns.{field}[{bad}]") from None


def _has(table: dict[int, Any], key: Any) -> bool:
    try:
        return key in table
    except TypeError:
        return False


def _known(column: tuple[str, ...], known: Any, field: str) -> None:
    if not known >= set(column):
        bad = next(i for i, x in enumerate(column) if x not in known)
        raise WireError(f"columns.{field}[{bad}]: {column[bad]!r} is not a {field}", f"columns.{field}[{bad}]")


def _label_set(i: int, val: Any) -> Labels:
    plain = () if val is None else plain_labels(val)
    if plain is not None:
        return plain
    raise WireError(f"labels[{i}] must be null or an object of strings", f"labels[{i}]")


def _floats(column: list[Any], field: str, optional: bool = False) -> tuple[Any, ...]:
    """A number column: every item a finite float, or null where ``optional``; ts and value turn
    -0.0 into 0.0 as versions 1 and 2 do. Checked whole, by the items' types and a finite sum; a
    NaN, an infinity, an overflow of finite items, an integer or anything else takes the
    item-by-item pass, which converts an integer and names a bad item."""
    if set(map(type, column)) <= (OPTIONAL_FLOAT if optional else FLOAT) and math.isfinite(
        sum(filter(None, column), 0.0)
    ):
        if optional or 0.0 not in column:  # ``in`` finds -0.0 too
            return tuple(column)
        return tuple([x or 0.0 for x in column])
    out: list[float | None] = []
    for i, x in enumerate(column):
        if x is None and optional:
            out.append(None)
            continue
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise WireError(f"columns.{field}[{i}] must be a number", f"columns.{field}[{i}]")
        try:
            f = float(x)
        except OverflowError:  # an integer past a float's range
            f = math.inf
        if not math.isfinite(f):
            raise WireError(f"columns.{field}[{i}] must be finite", f"columns.{field}[{i}]")
        out.append(f if optional else f or 0.0)
    return tuple(out)
