"""Raw points in chunks (``chunks.py``), written and read in one dialect's SQL.

Both databases keep a stored batch's raw points as one chunk row (SQLite since migration 0008,
PostgreSQL since 0011): ``ChunkSQL`` holds the statements with the driver's placeholder and the
readers built on them, so the stream, the latest values' replay, a series' history and the
correlator's partition reads run the same code on either. A read past a cursor goes a page of
chunks at a time (``PAGE`` rows, ``LIMIT``): psycopg fetches a whole result, and a cursor far
behind must not bring every chunk since into memory to return ``limit`` points.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from fabricd.server.store.chunks import TABLE, pack, pack_columns, unpack_stored
from fabricd.server.store.records import PointRow

if TYPE_CHECKING:
    from fabricd.server.store.sql import PointColumns

PAGE = 64  # chunks a query: ~30,000 points of 480-point batches, a detection read's size
Point = tuple[int, int, float, float, float | None, str, float | None]  # id, then a PointRow


@dataclass(frozen=True, slots=True)
class ChunkSQL:
    """The chunk statements with placeholder ``m``; ``insert`` is the dialect's INSERT, whose first
    parameter is the point count the chunk's ids are taken for; ``binary`` reads and writes the
    blob in the driver's binary format (psycopg: no hex text for a 20 KB blob)."""

    m: str
    insert: str
    binary: bool = False
    # PostgreSQL: the statement that takes a block of ids (its parameter the count) and returns
    # the last, and the INSERT of a chunk with its ``id`` given; for a batch split in time.
    take_ids: str | None = None
    insert_at: str | None = None

    # PostgreSQL: ``insert`` and the node's ``last_point_id`` in one statement (``write_marked``);
    # its parameters are ``insert``'s, then the node.
    insert_marking: str | None = None

    def write(
        self,
        cur: Any,
        node: str,
        rows: Sequence[PointRow],
        columns: PointColumns | None = None,
        width: float | None = None,
    ) -> bytes | None:
        """The writer's insert of a batch's points: one chunk. The connection's last generated id
        is then the batch's last point id. Returns the chunk's packed points when one chunk holds
        them all (the latest values' flush writes a node's row from them: ``LatestMemory.packed``).

        With ``width`` (PostgreSQL's time partitions), a batch whose points span a partition
        boundary (a spooled backlog) is cut into runs that each lie in one partition, so that a
        partition folded or dropped whole holds only its own time; the runs keep the batch's row
        order, and its ids are taken in one block, consecutive as the stream's tail expects."""
        return self._write(cur, node, rows, columns, width, None)[0]

    def write_marked(
        self,
        cur: Any,
        node: str,
        rows: Sequence[PointRow],
        mark: str,
        columns: PointColumns | None = None,
        width: float | None = None,
    ) -> tuple[bytes | None, int]:
        """``write``, then the node's last point id recorded by ``mark`` (``node_last_point``,
        reading the connection's last generated id) and returned. Where the dialect has
        ``insert_marking`` and one chunk holds the batch, both are one statement: at steady state a
        batch's three round trips under the write lock become two."""
        blob, last = self._write(cur, node, rows, columns, width, self.insert_marking)
        if last is None:
            cur.execute(mark, (node,))
            last = int(cur.fetchone()[0])
        return blob, last

    def _write(
        self,
        cur: Any,
        node: str,
        rows: Sequence[PointRow],
        columns: PointColumns | None,
        width: float | None,
        marking: str | None,
    ) -> tuple[bytes | None, int | None]:
        """``write``'s chunks; with ``marking`` and one chunk, the node's last point id as well."""
        blob, ts_min, ts_max = pack(rows) if columns is None else pack_columns(*columns)
        if width is None or ts_min // width == ts_max // width or self.take_ids is None:
            if marking is None:
                cur.execute(self.insert, (len(rows), len(rows), node, ts_min, ts_max, blob))
                return blob, None
            cur.execute(marking, (len(rows), len(rows), node, ts_min, ts_max, blob, node))
            return blob, int(cur.fetchone()[0])
        cur.execute(self.take_ids, (len(rows),))
        last = int(cur.fetchone()[0])
        first = last - len(rows) + 1
        for start, end in _runs([r[1] // width for r in rows]):
            blob, ts_min, ts_max = pack(rows[start:end])
            cur.execute(self.insert_at, (first + end - 1, end - start, node, ts_min, ts_max, blob))
        return None, None

    def after(self, cur: Any, cursor: int, limit: int) -> list[Point]:
        """Raw points with ids above ``cursor``, in id order, at most ``limit``."""
        return self._paged(cur, f"SELECT id, count, points, ids FROM {TABLE} WHERE id > {self.m}", (), cursor, limit)

    def of_nodes(self, cur: Any, nodes: list[str], cursor: int, end: int, limit: int) -> list[Point]:
        """As ``after``, of ``nodes``' points only and none above ``end`` (PostgreSQL: an array
        parameter; the correlator's partition reads)."""
        where = f"SELECT id, count, points, ids FROM {TABLE} WHERE node = ANY({self.m}) AND id > {self.m}"
        return [p for p in self._paged(cur, where, (nodes,), cursor, limit, end) if p[0] <= end]

    def _paged(
        self, cur: Any, select: str, params: tuple[Any, ...], cursor: int, limit: int, end: int | None = None
    ) -> list[Point]:
        # A chunk's ``id`` is its last point's: one with points above the cursor has ``id > cursor``.
        sql = f"{select} ORDER BY id LIMIT {PAGE}"
        out: list[Point] = []
        while len(out) < limit:
            found = self._fetch(cur, sql, (*params, cursor))
            for last_id, count, blob, ids in found:
                points = unpack_stored(last_id, count, blob, ids)
                out.extend(
                    points if ids is None and last_id - count >= cursor else [p for p in points if p[0] > cursor]
                )
            if len(found) < PAGE or (end is not None and found[-1][0] >= end):
                break
            cursor = found[-1][0]
        del out[limit:]
        return out

    def first_since(self, cur: Any, nodes: list[str], since_ts: float, upto: int) -> int | None:
        """The smallest id of ``nodes``' points with ``ts >= since_ts`` and ``id <= upto``: in the
        first chunk (in id order) that holds one, since ids grow from chunk to chunk."""
        sql = (
            f"SELECT id, count, points, ids FROM {TABLE} WHERE node = ANY({self.m}) AND ts_max >= {self.m} "
            f"AND id - count < {self.m} ORDER BY id LIMIT {PAGE}"
        )
        for last_id, count, blob, ids in self._fetch(cur, sql, (nodes, since_ts, upto)):
            found = [p[0] for p in unpack_stored(last_id, count, blob, ids) if p[2] >= since_ts and p[0] <= upto]
            if found:
                return min(found)
        return None

    def replay(self, cur: Any, cursor: int) -> Iterator[tuple[str, list[PointRow]]]:
        """Raw points with ids above ``cursor``, in id order, as (node, its rows) a chunk at a time:
        the latest values' replay after a crash."""
        sql = f"SELECT id, count, node, points, ids FROM {TABLE} WHERE id > {self.m} ORDER BY id"
        for last_id, count, node, blob, ids in self._fetch(cur, sql, (cursor,)):
            yield node, [p[1:] for p in unpack_stored(last_id, count, blob, ids) if p[0] > cursor]

    def of_series(
        self, cur: Any, node: str, series_id: int, since: float, until: float
    ) -> list[tuple[float, float, float | None, str]]:
        """The raw points of one series of ``node`` with ``since <= ts <= until``: (ts, value,
        rate, status), in time order."""
        m = self.m
        sql = f"SELECT id, count, points, ids FROM {TABLE} WHERE node = {m} AND ts_min <= {m} AND ts_max >= {m}"
        found = [
            (p[2], p[3], p[4], p[5])
            for last_id, count, blob, ids in self._fetch(cur, sql, (node, until, since))
            for p in unpack_stored(last_id, count, blob, ids)
            if p[1] == series_id and since <= p[2] <= until
        ]
        found.sort(key=lambda p: p[0])
        return found

    def _fetch(self, cur: Any, sql: str, params: Sequence[Any]) -> list[Any]:
        if self.binary:
            cur.execute(sql, params, binary=True)
        else:
            cur.execute(sql, params)
        rows: list[Any] = cur.fetchall()
        return rows


def _runs(keys: Sequence[float]) -> list[tuple[int, int]]:
    """[start, end) of each run of equal consecutive keys."""
    cuts = [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]]
    bounds = [0, *cuts, len(keys)]
    return list(pairwise(bounds))
