"""PostgreSQL's side of the raw statements (psycopg 3, ``%s`` placeholders).

Raw points go in chunks, one row per batch (``chunks.py``), into ``point_chunks``, partitioned on
``ts_min`` (``partitions.py``, migration 0011); new series in one statement with one array
parameter per column (``ArrayRows``).

A chunk's points take ``count`` consecutive ids of ``points_id_seq``, which every replica shares:
``fabricd_point_ids(n)`` (migration 0011) takes ``nextval`` and moves the sequence ``n - 1`` on,
under a session advisory lock held for those two calls only, not to commit. Ids then follow commit
order per partition of the bus (one writer each), which is what the correlator's partition stream
relies on, and a single central's write lock orders them all. ``setval`` sets the session's
``lastval()``, so the node's update still reads the batch's last point id from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fabricd.server.store.chunk_reads import ChunkSQL
from fabricd.server.store.chunks import TABLE
from fabricd.server.store.sql import (
    CLAIM_BATCH,
    LATEST_ROWS,
    SERIES_COLUMNS,
    SERIES_CONFLICT,
    SERIES_RETURNING,
    UPSERT_NODE,
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


# ``%b``: the blob goes as binary bytea, not as hex text twice its size.
CHUNKS = ChunkSQL(
    "%s",
    f"INSERT INTO {TABLE} (id, count, node, ts_min, ts_max, points) VALUES (fabricd_point_ids(%s), %s, %s, %s, %s, %b)",
    binary=True,
    take_ids="SELECT fabricd_point_ids(%s)",
    insert_at=f"INSERT INTO {TABLE} (id, count, node, ts_min, ts_max, points) VALUES (%s, %s, %s, %s, %s, %b)",
)

STATEMENTS = statements(
    "%s",
    chunks=CHUNKS,
    insert_series=ReturnedSeries(
        ArrayRows(
            f"INSERT INTO series ({SERIES_COLUMNS}) SELECT * FROM unnest({', '.join(['%b::text[]'] * 9)}) "
            f"{SERIES_CONFLICT} {SERIES_RETURNING}"
        )
    ),
    latest_of=_latest_of,
    # Folded points keep their bucket's newest raw id (``chunk_fold.py``): the head never goes back
    # when a folded partition's chunks are dropped.
    max_point_id=f"SELECT greatest((SELECT max(id) FROM {TABLE}), (SELECT max(id) FROM points))",
    last_point_id="lastval()",
    claim_and_upsert_node=f"WITH claimed AS ({CLAIM_BATCH.format(m='%s')} RETURNING 1) "
    f"{UPSERT_NODE.format(rows='SELECT %s, %s, %s, %s, %s, 1, %s WHERE EXISTS (SELECT 1 FROM claimed)')}",
    series_identity=_series_identity,
    serial_writes=False,
)
