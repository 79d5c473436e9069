"""SQLite's side of the raw statements (sqlite3, ``?`` placeholders).

Raw points go in chunks, one row per batch (``chunks.py``, ids from ``sqlite_sequence``); new
series in multi-row ``VALUES`` statements (``ManyRows``), numbered by the writer
(``NumberedSeries``). The last point id of a batch is the connection's ``last_insert_rowid()``,
returned by the node's update.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

from fabricd.server.store.chunk_reads import ChunkSQL
from fabricd.server.store.chunks import TABLE
from fabricd.server.store.sql import LATEST_ROWS, SERIES_COLUMNS, SERIES_CONFLICT, statements


class ManyRows:
    """One statement for many rows (``VALUES (..), (..), ..``), run in power-of-two sized chunks.

    Python's sqlite3 releases the GIL around every ``sqlite3_step``, so an executemany of 500 rows
    gives the GIL away 500 times, and under concurrent requests (decoding, the event loop) the writer
    can wait up to the switch interval (5 ms) each time to get it back: measured, the server stored
    points 3x slower than the same executemany in a quiet process. One statement per chunk steps
    once. Power-of-two sizes keep the distinct statement texts few, so each is prepared once and
    then found in sqlite3's statement cache (``cached_statements``). 512 rows x 10 parameters (a
    series row) stays far below SQLite's parameter limit (32,766).
    """

    MAX_ROWS = 512

    def __init__(self, template: str, row: str) -> None:
        self.template, self.row = template, row
        self._texts: dict[int, str] = {}

    def text(self, rows: int) -> str:
        sql = self._texts.get(rows)
        if sql is None:
            sql = self._texts[rows] = self.template.format(values=", ".join([self.row] * rows))
        return sql

    def changes(self, cur: Any, rows: Sequence[tuple[Any, ...]]) -> int:
        """Runs the statement over ``rows`` (no ``RETURNING``); how many rows it changed."""
        start, n, changed = 0, len(rows), 0
        while start < n:
            size = min(self.MAX_ROWS, 1 << ((n - start).bit_length() - 1))
            cur.execute(self.text(size), list(chain.from_iterable(rows[start : start + size])))
            changed += cur.rowcount
            start += size
        return changed


class NumberedSeries:
    """A node's new series (``sql.SeriesWriter``), numbered here rather than by ``RETURNING``.

    ``INSERT .. RETURNING`` built a Python row per new series (six objects each) and stepped once a
    row, giving the GIL away each time: 4.5 µs of CPU a series on a fleet's first scrape against 3.2
    numbered here (300 nodes x 480 series, in-process, 2026-12-06), and that scrape is a third of
    ``make bench``'s ingest rows. The ids are the ones SQLite would have chosen itself, the largest
    rowid plus one, then the next (https://www.sqlite.org/autoinc.html): read under the write lock
    the writer's transaction already holds (its batch claim wrote first), so no other connection
    can take them meanwhile. A series another writer created before that is an ``ON CONFLICT``
    no-op and takes no id; then the rows that did go in are read back by their numbers.
    """

    def __init__(self, insert: ManyRows) -> None:
        self.insert = insert

    def run(self, cur: Any, rows: Sequence[tuple[Any, ...]]) -> list[int | None]:
        cur.execute("SELECT coalesce(max(id), 0) + 1 FROM series")
        first = int(cur.fetchone()[0])
        ids = range(first, first + len(rows))
        # Each row with its id first, in C: the transpose of the rows, then of the columns with the ids.
        if self.insert.changes(cur, list(zip(ids, *zip(*rows, strict=True), strict=True))) == len(rows):
            return list(ids)
        cur.execute("SELECT id FROM series WHERE id BETWEEN ? AND ?", (first, ids[-1]))
        stored = {sid for (sid,) in cur}
        return [sid if sid in stored else None for sid in ids]


def _series_identity(ids: list[int]) -> tuple[str, Sequence[Any]]:
    # Callers pass at most 2,000 ids: under SQLite's default limit of 32,766 parameters.
    marks = ", ".join("?" * len(ids))
    return _IDENTITY.format(ids=f"IN ({marks})"), ids


def _latest_of(nodes: Sequence[str] | None, _lock: bool) -> tuple[str, Sequence[Any]]:
    # No row lock: SQLite has one writer, and its flush holds the write lock. Callers pass at most a
    # few hundred nodes, far under the parameter limit.
    if nodes is None:
        return LATEST_ROWS, ()
    return f"{LATEST_ROWS} WHERE node IN ({', '.join('?' * len(nodes))})", list(nodes)


# A chunk's ``id`` is the highest id ever given (``AUTOINCREMENT`` keeps it in ``sqlite_sequence``,
# migration 0008) plus its point count: given under the write lock, so in commit order, and never
# going back when maintenance has deleted every chunk.
_INSERT_CHUNK = (
    f"INSERT INTO {TABLE} (id, count, node, ts_min, ts_max, points) VALUES ((SELECT coalesce(max(seq), 0) "
    f"FROM sqlite_sequence WHERE name = '{TABLE}') + ?, ?, ?, ?, ?, ?)"
)
CHUNKS = ChunkSQL("?", _INSERT_CHUNK)

_IDENTITY = "SELECT id, node, source, device, port, counter, name, unit, kind, labels FROM series WHERE id {ids}"

STATEMENTS = statements(
    "?",
    chunks=CHUNKS,
    max_point_id=f"SELECT coalesce(max(id), 0) FROM {TABLE}",
    insert_series=NumberedSeries(
        ManyRows(
            f"INSERT INTO series (id, {SERIES_COLUMNS}) VALUES {{values}} {SERIES_CONFLICT}",
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
    ),
    latest_of=_latest_of,
    last_point_id="last_insert_rowid()",
    claim_and_upsert_node=None,  # no data-modifying CTE; a statement costs SQLite a few µs
    series_identity=_series_identity,
    serial_writes=True,
)
