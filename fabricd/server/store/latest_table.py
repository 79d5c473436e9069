"""The latest values' table (``latest_chunks``, migration 0009): a row per node, its series' newest
points packed as a raw-point chunk (``chunks.pack``); and the series rows' ``latest_*`` that a
release before 0009 wrote, read beside it (store/latest.py has the why)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any

from fabricd.server.store import chunks
from fabricd.server.store.records import PointRow
from fabricd.server.store.sql import Database


def groups_of(names: list[str], counts: dict[str, int], series: int) -> list[list[str]]:
    """``names`` in runs of about ``series`` series (at least one node a run; one empty run if none)."""
    groups: list[list[str]] = [[]]
    size = 0
    for name in names:
        if groups[-1] and size + counts.get(name, 0) > series:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += counts.get(name, 0)
    return groups


def newer_stored(mine: dict[int, PointRow], blob: bytes, count: int, node: str) -> list[PointRow]:
    """The stored rows newer than memory's (or that memory lacks)."""
    sids, times = chunks.series_times(blob, count, f"of the latest values of {node!r}")
    get = mine.get
    if all((m := get(sid)) is not None and m[1] >= t for sid, t in zip(sids, times, strict=True)):
        return []
    return [r for r in chunks.rows(blob, count, node) if (m := get(r[0])) is None or m[1] < r[1]]


def stored_rows(
    cur: Any, db: Database, nodes: Sequence[str] | None, keep: Collection[int] | None = None
) -> Iterator[tuple[str, list[PointRow]]]:
    """(node, its rows) from the table: the packed rows, then the series rows' ``latest_*`` that a
    release before migration 0009 wrote (a replica not yet upgraded, in a rolling upgrade); a node
    can appear twice, and the newest point of a series wins (``LatestMemory.apply``, ``newest``). Only
    the series ids in ``keep`` if given."""
    if nodes is not None and not nodes:
        return
    sql, params = db.sql.latest_of(nodes, False)
    cur.execute(sql, params)
    for node, count, blob in cur.fetchall():
        yield node, chunks.rows(bytes(blob), count, f"of the latest values of {node!r}", keep)
    legacy, params = db.sql.table_latest, []
    if nodes is not None:
        legacy, params = f"{legacy} AND node IN ({', '.join([db.sql.mark] * len(nodes))})", list(nodes)
    cur.execute(legacy, params)
    for node, rows in by_node(cur):
        yield node, rows if keep is None else [row for row in rows if row[0] in keep]


def newest(rows: Iterable[PointRow]) -> dict[int, PointRow]:
    """The newest row of each series id (on a tie the later one, as ``LatestMemory.apply``)."""
    out: dict[int, PointRow] = {}
    for row in rows:
        old = out.get(row[0])
        if old is None or old[1] <= row[1]:
            out[row[0]] = row
    return out


def by_node(cur: Any, size: int = 10_000) -> Iterator[tuple[str, list[PointRow]]]:
    """(node, rows) from a cursor of (node, series id, ts, value, rate, status, since), in chunks."""
    while chunk := cur.fetchmany(size):
        groups: dict[str, list[PointRow]] = {}
        for node, *row in chunk:
            groups.setdefault(node, []).append(tuple(row))
        yield from groups.items()
