"""Raw points: one row per stored batch, its points packed in columns (a chunk).

A row per point cost SQLite about 3 µs a point (a table B-tree entry and two index entries, each
bound parameter by parameter under the GIL), three quarters of the store stage, and no SQLite
setting moved it (docs/storage.md, "Raw points in chunks"). On PostgreSQL it cost the server 5.2 µs
a point (heap, two B-trees, their WAL) against 0.6 for a chunk (docs/storage.md, "PostgreSQL's
share of a sample"). A chunk is one row per batch: the points' series ids, times, values, rates,
statuses and since times as little-endian arrays, as TSDBs keep their samples (Prometheus's
blocks, TimescaleDB's compressed chunks).

The chunk's ``id`` is the id of its last point, the chunk holds ``count`` points with the
consecutive ids before it: point ids are as before (the detection stream's cursor, the latest
values' cursor, ``nodes.last_point_id``), and the connection's last generated id is still the
batch's last point id. How each database gives the ids, and the readers: ``chunk_reads.py``.
This module is the format, and SQLite's fold a node at a time (``take_node_before``,
``delete_before``); PostgreSQL folds and drops whole time partitions (``chunk_fold.py``). Folded
points (``step > 0``) stay rows of ``points``: there are few of them.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Collection, Sequence
from typing import Any, cast

from fabricd.model import Status
from fabricd.server.store.records import PointRow

TABLE = "point_chunks"
NAN = float("nan")  # an absent rate or since: the wire refuses non-finite numbers, so NaN is free
_STATUS = tuple(s.value for s in Status)  # the code of a status is its index
_CODE = {s: i for i, s in enumerate(_STATUS)}
_SWAP = sys.byteorder != "little"  # the file is the same on every machine

# Maintenance finds old chunks by their earliest point (``ix_point_chunks_ts``: ts_min, node), a
# range over the chunks being folded, not over the whole raw retention.
_NODES_BEFORE = f"SELECT DISTINCT node FROM {TABLE} WHERE ts_min < ?"
_OF_NODE_BEFORE = f"SELECT id, count, points, ids FROM {TABLE} WHERE node = ? AND ts_min < ?"
_KEEP_REST = f"UPDATE {TABLE} SET count = ?, ts_min = ?, ts_max = ?, points = ?, ids = ? WHERE id = ?"


def pack(rows: Sequence[PointRow]) -> tuple[bytes, float, float]:
    """The rows' columns as one blob, with their earliest and latest time."""
    return pack_columns(*zip(*rows, strict=True))  # the transpose in C


def pack_columns(
    sids: Sequence[int],
    times: Sequence[float],
    values: Sequence[float],
    rates: Sequence[float | None],
    statuses: Sequence[str],
    since: Sequence[float | None],
) -> tuple[bytes, float, float]:
    """As ``pack``, from the columns themselves (a decoded batch's, ``wire_columns``).

    A fleet's chunks are mostly alike: one scrape's time, every status ``ok``, no saturation
    time, and a rate on every counter after the first scrape. Those columns are checked whole in
    C (``count``) and written without a pass per point; the rest take the general pass. Packing a
    480-point batch point by point was 10 % of the central's GIL time at 1,000 nodes (py-spy)."""
    n = len(sids)
    first = times[0]
    if first != 0.0 and times.count(first) == n:  # one scrape: its time, repeated (0.0 may be -0.0)
        ts, ts_min, ts_max = array("d", [first]) * n, first, first
    else:
        ts = array("d", times)
        ts_min, ts_max = min(times), max(times)
    columns: list[array[Any]] = [array("q", sids), ts, array("d", values), _optional(rates, n), _optional(since, n)]
    if _SWAP:
        for c in columns:
            c.byteswap()
    codes = bytes(n) if statuses.count(_STATUS[0]) == n else bytes(map(_CODE.__getitem__, statuses))
    return b"".join([c.tobytes() for c in columns]) + codes, ts_min, ts_max


def _optional(column: Sequence[float | None], n: int) -> array[float]:
    """An optional float column, NaN for None."""
    if column.count(None) == n:
        return array("d", [NAN]) * n
    try:
        return array("d", cast(Sequence[float], column))  # every one a float (array refuses None)
    except TypeError:
        return array("d", [NAN if x is None else x for x in column])


def unpack(
    last_id: int, count: int, blob: bytes, ids: bytes | None = None
) -> list[tuple[int, int, float, float, float | None, str, float | None]]:
    """The chunk's points as the stream reads them: (id, series id, ts, value, rate, status, since).
    Their ids are the ``count`` up to ``last_id``, or ``ids`` once maintenance has folded part of
    the chunk (``take_node_before``)."""
    sids, ts, values, rates, since = _columns(blob, count, last_id, 5)
    status = [_STATUS[c] for c in memoryview(blob)[40 * count :]]
    columns = zip(_ids(last_id, count, ids), sids, ts, values, rates, status, since, strict=True)
    return [(i, sid, t, v, None if r != r else r, s, None if c != c else c) for i, sid, t, v, r, s, c in columns]


def unpack_stored(
    last_id: int, count: int, blob: Any, ids: Any
) -> list[tuple[int, int, float, float, float | None, str, float | None]]:
    """``unpack`` of a chunk row as a driver returns it (its blobs as bytes, or a buffer)."""
    return unpack(last_id, count, bytes(blob), None if ids is None else bytes(ids))


def rows(blob: bytes, count: int, where: object = "", keep: Collection[int] | None = None) -> list[PointRow]:
    """The packed rows themselves: (series id, ts, value, rate, status, since), only those of the
    series ids in ``keep`` if given (the columns are decoded in C; a row costs a tuple). ``where``
    names the blob in the error a blob of the wrong size raises."""
    sids, ts, values, rates, since = _columns(blob, count, where, 5)
    codes = memoryview(blob)[40 * count :]
    if keep is None:
        columns = zip(sids, ts, values, rates, [_STATUS[c] for c in codes], since, strict=True)
        return [(sid, t, v, None if r != r else r, s, None if c != c else c) for sid, t, v, r, s, c in columns]
    out: list[PointRow] = []
    for i in [i for i, sid in enumerate(sids) if sid in keep]:
        r, c = rates[i], since[i]
        out.append((sids[i], ts[i], values[i], None if r != r else r, _STATUS[codes[i]], None if c != c else c))
    return out


def series_times(blob: bytes, count: int, where: object = "") -> tuple[list[int], list[float]]:
    """Only the series ids and times of packed rows: what a merge compares, without the rows."""
    sids, ts = _columns(blob, count, where, 2)
    return sids, ts


def _columns(blob: bytes, n: int, where: object, wanted: int) -> list[list[Any]]:
    """The first ``wanted`` of the five 8-byte columns, as lists."""
    if len(blob) != 41 * n:
        raise ValueError(f"point chunk {where} holds {len(blob)} bytes, not the {41 * n} of {n} points")
    view = memoryview(blob)
    out = []
    for i, code in enumerate("qdddd"[:wanted]):
        column = array(code)
        column.frombytes(view[8 * n * i : 8 * n * (i + 1)])
        if _SWAP:
            column.byteswap()
        out.append(column.tolist())
    return out


def _ids(last_id: int, count: int, ids: bytes | None) -> list[int]:
    if ids is None:
        return list(range(last_id - count + 1, last_id + 1))
    column = array("q")
    column.frombytes(ids)
    if _SWAP:
        column.byteswap()
    return column.tolist()


def nodes_before(cur: Any, cutoff: float) -> list[str]:
    """The nodes with a raw point older than ``cutoff``."""
    return [node for (node,) in cur.execute(_NODES_BEFORE, (cutoff,)).fetchall()]


def take_node_before(cur: Any, node: str, cutoff: float) -> dict[int, list[tuple[float, float, float | None, str]]]:
    """Takes the node's raw points older than ``cutoff`` out of their chunks and returns them by
    series, each series' (ts, value, rate, status) in time order: maintenance folds them in the same
    transaction. A chunk left with newer points keeps them, with their ids (a spooled backlog's
    batch can span hours)."""
    by_series: dict[int, list[tuple[float, float, float | None, str]]] = {}
    for last_id, count, blob, ids in cur.execute(_OF_NODE_BEFORE, (node, cutoff)).fetchall():
        rest = []
        for p in unpack(last_id, count, blob, ids):
            if p[2] < cutoff:
                by_series.setdefault(p[1], []).append((p[2], p[3], p[4], p[5]))
            else:
                rest.append(p)
        if not rest:
            cur.execute(f"DELETE FROM {TABLE} WHERE id = ?", (last_id,))
            continue
        packed, ts_min, ts_max = pack([p[1:] for p in rest])
        kept = array("q", [p[0] for p in rest])
        if _SWAP:
            kept.byteswap()
        cur.execute(_KEEP_REST, (len(rest), ts_min, ts_max, packed, kept.tobytes(), last_id))
    for points in by_series.values():
        points.sort(key=lambda p: p[0])
    return by_series


def delete_before(cur: Any, cutoff: float, table: str = TABLE, m: str = "?") -> int:
    """Deletes the chunks of ``table`` wholly before ``cutoff`` (retention; on PostgreSQL the
    default partition's strays, placeholder ``m``); returns the points they held."""
    wholly = f"ts_min < {m} AND ts_max < {m}"
    cur.execute(f"SELECT coalesce(sum(count), 0) FROM {table} WHERE {wholly}", (cutoff, cutoff))
    (points,) = cur.fetchone()
    cur.execute(f"DELETE FROM {table} WHERE {wholly}", (cutoff, cutoff))
    return int(points)
