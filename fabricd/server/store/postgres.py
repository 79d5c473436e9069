"""PostgreSQL's side of the raw statements (psycopg 3, ``%s`` placeholders).

Raw points go in chunks, one row per batch (``chunks.py``), into ``point_chunks``, partitioned on
``ts_min`` (``partitions.py``, migration 0011); a node's new series in one statement, each
column one joined text parameter (``JoinedSeries``), or one array parameter per column
(``ArrayRows``) where that cannot be.

A chunk's points take ``count`` consecutive ids of ``points_id_seq``, which every replica shares:
``fabricd_point_ids(n)`` (migration 0011) takes ``nextval`` and moves the sequence ``n - 1`` on,
under a session advisory lock held for those two calls only, not to commit. Ids then follow commit
order per partition of the bus (one writer each), which is what the correlator's partition stream
relies on, and a single central's write lock orders them all. ``setval`` sets the session's
``lastval()``, so the node's update still reads the batch's last point id from it.
"""

from __future__ import annotations

import weakref
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
    SeriesWriter,
    statements,
)

UNIQUE_VIOLATION = "23505"  # SQLSTATE unique_violation (PostgreSQL, Appendix A)


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


class JoinedSeries:
    """A node's new series (``sql.SeriesWriter``) as a plain ``INSERT`` of joined columns, inside a
    savepoint; ``ON CONFLICT`` (``fallback``) where that fails or cannot be used.

    Two costs of ``ReturnedSeries`` on a fleet's first scrape, measured on PostgreSQL 15 (480
    series a node, 500 nodes, AMD EPYC, 2026-12-07; ``docs/storage.md``): ``ON CONFLICT DO
    NOTHING`` checks the unique index before each insert and inserts speculatively (14-18 µs of
    the server's CPU a series, 11-12 without it), and psycopg dumps a ``text[]`` in Python (2.3 µs
    of the client's CPU a series for nine arrays, against 0.3 for nine ``str.join``). So the
    columns go as one text each, split by ``string_to_array`` on the server; the ids are taken from
    the sequence first, so each row's id is known without matching ``RETURNING`` rows back; and a
    series another replica stored meanwhile is a unique violation that rolls back to the savepoint,
    after which ``fallback`` inserts the rows as before.

    Each savepoint is a subtransaction whose id the transaction keeps until it commits; past 64 of
    them PostgreSQL's snapshots overflow their subtransaction cache and every session's reads slow
    down. A group commit holds at most one batch per thread of the ingest pool (40), so
    ``MAX_SAVEPOINTS`` a transaction is only a guard. Small additions (a counter that appears on
    a known node) take ``fallback``: the three extra statements (ids, savepoint, release) cost
    more than they save there.
    """

    SEPARATOR = "\x1f"  # ASCII unit separator; a column holding one takes ``fallback``
    MIN_ROWS = 64
    MAX_SAVEPOINTS = 32
    TAKE_IDS = (
        "SELECT nextval(q.seq) FROM (SELECT pg_get_serial_sequence('series', 'id')::regclass AS seq OFFSET 0) q "
        "CROSS JOIN generate_series(1, %s)"  # OFFSET 0: not flattened, so the name is looked up once
    )

    def __init__(self, fallback: SeriesWriter) -> None:
        self.fallback = fallback
        split = ", ".join(["string_to_array(%s, E'\\x1f')"] * 9)
        self.insert = f"INSERT INTO series (id, {SERIES_COLUMNS}) SELECT * FROM unnest(%s::bigint[], {split})"
        self._savepoints: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # by cursor

    def run(self, cur: Any, rows: Sequence[tuple[Any, ...]]) -> list[int | None]:
        joined = self._joined(rows) if len(rows) >= self.MIN_ROWS else None
        taken = self._savepoints.get(cur, 0)  # the writer's cursor lives one transaction
        if joined is None or taken >= self.MAX_SAVEPOINTS:
            return self.fallback.run(cur, rows)
        self._savepoints[cur] = taken + 1
        cur.execute(self.TAKE_IDS, (len(rows),))
        ids = [sid for (sid,) in cur.fetchall()]
        cur.execute("SAVEPOINT fabricd_new_series")
        try:
            cur.execute(self.insert, ("{" + ",".join(map(str, ids)) + "}", *joined))
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != UNIQUE_VIOLATION:
                raise
            cur.execute("ROLLBACK TO SAVEPOINT fabricd_new_series")  # the ids taken stay unused: a gap
            return self.fallback.run(cur, rows)
        cur.execute("RELEASE SAVEPOINT fabricd_new_series")
        return list(ids)

    def _joined(self, rows: Sequence[tuple[Any, ...]]) -> list[str] | None:
        """Each column as one text; None if a value is not a string or holds the separator (it
        would split into two)."""
        sep, n = self.SEPARATOR, len(rows)
        try:
            joined = [sep.join(column) for column in zip(*rows, strict=True)]
        except TypeError:  # a None or a number: the arrays carry those
            return None
        return joined if all(text.count(sep) == n - 1 for text in joined) else None


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
    # The chunk's id is its last point's: the node's ``last_point_id`` (the claim upserted the node
    # row earlier in the transaction, so the update finds it).
    insert_marking=f"WITH c AS (INSERT INTO {TABLE} (id, count, node, ts_min, ts_max, points) VALUES "
    "(fabricd_point_ids(%s), %s, %s, %s, %s, %b) RETURNING id) "
    "UPDATE nodes SET last_point_id = c.id FROM c WHERE nodes.name = %s RETURNING c.id",
)

STATEMENTS = statements(
    "%s",
    chunks=CHUNKS,
    insert_series=JoinedSeries(
        ReturnedSeries(
            ArrayRows(
                f"INSERT INTO series ({SERIES_COLUMNS}) SELECT * FROM unnest({', '.join(['%b::text[]'] * 9)}) "
                f"{SERIES_CONFLICT} {SERIES_RETURNING}"
            )
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
