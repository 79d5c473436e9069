"""PostgreSQL's side of the raw statements (psycopg 3, ``%s`` placeholders).

Points go in by ``COPY`` in binary (``CopyRows``) into the time-partitioned ``points``
(``partitions.py``), which routes each row to its partition; new series in one statement with
one array parameter per column (``ArrayRows``). The writer needs only the batch's last point id
after the copy (``lastval()``: ``COPY`` fills ``id`` from the sequence's default in this session).
Measured against ``executemany`` and ``unnest(arrays)``: docs/storage.md, "Bulk path".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fabricd.server.store.sql import (
    CLAIM_BATCH,
    LATEST_ROWS,
    SERIES_COLUMNS,
    SERIES_CONFLICT,
    SERIES_RETURNING,
    UPSERT_NODE,
    PointColumns,
    statements,
)


class ArrayRows:
    """One statement for all rows, one array parameter per column (``unnest``).

    psycopg parses every query text longer than 4 KiB again on each execute (its query cache
    skips long texts), which made multi-row VALUES slower than executemany there; arrays keep the
    text short and constant, and psycopg dumps each list in C.
    """

    def __init__(self, sql: str) -> None:
        self.sql = sql

    def run(self, cur: Any, rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        if not rows:
            return []
        cur.execute(self.sql, [list(column) for column in zip(*rows, strict=True)])
        return cur.fetchall() if cur.description is not None else []


class ReturnedSeries:
    """A node's new series (``sql.SeriesWriter``) in one ``unnest`` statement, their ids from its
    ``RETURNING`` matched back to the rows by identity (a multi-row ``RETURNING``'s order is
    unspecified); a series another replica created meanwhile is not returned."""

    def __init__(self, insert: ArrayRows) -> None:
        self.insert = insert

    def run(self, cur: Any, rows: Sequence[tuple[Any, ...]]) -> list[int | None]:
        made = {(src, dev, port, ctr, labels): sid for sid, src, dev, port, ctr, labels in self.insert.run(cur, rows)}
        return [made.get((src, dev, port, ctr, labels)) for _node, src, dev, port, ctr, labels, *_ in rows]


class CopyRows:
    """``COPY .. FROM STDIN (FORMAT BINARY)``, one row at a time through psycopg's C writer.

    Binary needs the column types up front (``set_types``) and then formats nothing: 1.2-1.4 µs of
    client CPU a point against 3.7 for ``unnest(arrays)`` and 17 for ``executemany``, and the server
    skips parsing an INSERT's plan (docs/storage.md)."""

    def __init__(self, sql: str, types: Sequence[str]) -> None:
        self.sql, self.types = sql, list(types)

    def write(self, cur: Any, node: str, rows: Sequence[tuple[Any, ...]], columns: PointColumns | None = None) -> None:
        """``node`` is not a column: each row's series says it. ``COPY`` takes rows."""
        if not rows:
            return
        with cur.copy(self.sql) as copy:
            copy.set_types(self.types)
            write = copy.write_row
            for row in rows:
                write(row)


def _series_identity(ids: list[int]) -> tuple[str, Sequence[Any]]:
    # One array parameter: psycopg re-parses long query texts, and the text stays constant.
    return "SELECT id, node, source, device, port, counter, name, unit, kind, labels FROM series WHERE id = ANY(%s)", (
        ids,
    )


def _latest_of(nodes: Sequence[str] | None, lock: bool) -> tuple[str, Sequence[Any]]:
    """``lock``: a replica's flush merges the stored row with its memory and writes it back; the
    row lock keeps another replica (the node's owner before a takeover) from writing in between.
    Locked in node order, so two flushes never wait on each other in a cycle."""
    sql, params = (LATEST_ROWS, ()) if nodes is None else (f"{LATEST_ROWS} WHERE node = ANY(%s)", (list(nodes),))
    return (f"{sql} ORDER BY node FOR UPDATE" if lock else sql), params


STATEMENTS = statements(
    "%s",
    # step is left to its default (0: raw); the columns of records.PointRow, in order.
    insert_points=CopyRows(
        "COPY points (series_id, ts, value, rate, status, since) FROM STDIN (FORMAT BINARY)",
        ["int8", "float8", "float8", "float8", "text", "float8"],
    ),
    insert_series=ReturnedSeries(
        ArrayRows(
            f"INSERT INTO series ({SERIES_COLUMNS}) SELECT * FROM unnest({', '.join(['%b::text[]'] * 9)}) "
            f"{SERIES_CONFLICT} {SERIES_RETURNING}"
        )
    ),
    latest_of=_latest_of,
    chunked=False,
    max_point_id="SELECT max(id) FROM points",
    last_point_id="lastval()",
    claim_and_upsert_node=f"WITH claimed AS ({CLAIM_BATCH.format(m='%s')} RETURNING 1) "
    f"{UPSERT_NODE.format(rows='SELECT %s, %s, %s, %s, %s, 1, %s WHERE EXISTS (SELECT 1 FROM claimed)')}",
    series_identity=_series_identity,
    serial_writes=False,
    binary_reads=True,
)
