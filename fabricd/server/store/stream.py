"""The sample stream: every stored raw point, in ingest order, for the detection loop (raw DBAPI).

A reader keeps a cursor (a point id; ``save_cursor`` persists it in the ``cursors`` table) and
reads what was stored after it as ``Delivery`` values: the samples of one node, consecutive in
ingest order, so a consumer that tracks nodes (per-node watermarks) gets the node once per run
of samples instead of once per sample.

Following the writer (``committed``, subscribed by ``Storage.open`` when detection runs), the
stream keeps the points of the last batches in memory (``_Tail``) and answers a reader that keeps
up from there, exactly as the database would; a reader further behind reads the database. A
stream read per partition or node set (issue 18) is a filter on the deliveries, plus a
``series.node`` condition on the database path.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain, filterfalse
from operator import itemgetter
from typing import Any

from fabricd.server.store.identities import Identities, Identity
from fabricd.server.store.plans import Chunk, deliveries, planned, read_back
from fabricd.server.store.records import Committed, Delivery, Keep
from fabricd.server.store.sql import Database

_SID = itemgetter(0)
# Points the tail keeps: ~100 bytes each, so ~10 MB; a detection loop reading 20,000 points a step
# stays served from memory unless it falls five steps behind.
TAIL_POINTS = 100_000


class Stream:
    def __init__(self, db: Database, identities: Identities, tail_points: int = 0) -> None:
        self.db, self.identities = db, identities
        self._tail = _Tail(tail_points) if tail_points > 0 else None

    def committed(self, batches: Sequence[Committed]) -> None:
        """The writer's post-commit hook: the batches join the tail, in commit order."""
        if self._tail is not None:
            self._tail.append(batches)

    def read(self, cursor: int, limit: int = 20_000, keep: Keep | None = None) -> tuple[list[Delivery], int]:
        """Raw samples stored after ``cursor`` in ingest order (at most ``limit`` points), and the
        cursor to pass next time; with ``keep``, only the samples of the series it keeps. Points
        are plain tuples joined in memory with the series identities."""
        served = self._tail.since(cursor, limit) if self._tail is not None else None
        if served is None:
            return self._read_database(cursor, limit, keep)
        chunks, upto = served
        idents = _Unknown(self.identities, chunks, keep)
        if keep is None:
            return deliveries([row for c in chunks for row in c.rows], idents), upto
        return planned(chunks, idents, keep), upto

    def _read_database(self, cursor: int, limit: int, keep: Keep | None) -> tuple[list[Delivery], int]:
        with self.db.cursor() as cur:
            found = self.db.sql.chunks.after(cur, cursor, limit)
            idents = self.identities.load(cur, {row[1] for row in found})
        upto = found[-1][0] if found else cursor
        return read_back([row[1:] for row in found], idents, keep), upto

    def head(self) -> int:
        """The newest stored point's id: the tail's when it follows the writer (the detection loop
        asks every step, and ``max(id)`` cost a query each time), else the table's."""
        newest = self._tail.newest() if self._tail is not None else None
        return newest if newest is not None else self.db.max_point_id()

    def cursor(self, name: str) -> int:
        with self.db.cursor() as cur:
            cur.execute(self.db.sql.read_cursor, (name,))
            found = cur.fetchone()
        return int(found[0]) if found else 0

    def save_cursor(self, name: str, position: int) -> None:
        with self.db.side_write_lock(), self.db.cursor(transaction=True) as cur:
            cur.execute(self.db.sql.upsert_cursor, (name, position))


class _Unknown(Mapping[int, Identity]):
    """The identities of the rows' series a ``Keep`` has not learned yet, fetched on the first
    lookup, all at once: a reader that knows every series (the steady state) makes no pass over
    the rows to collect their ids (a tenth of the detection loop's read at 500 nodes)."""

    def __init__(self, identities: Identities, chunks: Sequence[Chunk], keep: Keep | None) -> None:
        self._identities, self._chunks, self._keep = identities, chunks, keep
        self._found: Mapping[int, Identity] | None = None

    def _load(self) -> Mapping[int, Identity]:
        if self._found is None:
            known = self._keep.known if self._keep is not None else {}
            ids = chain.from_iterable(c.sids for c in self._chunks)
            self._found = self._identities.of(set(filterfalse(known.__contains__, ids)))  # in C
        return self._found

    def loaded(self) -> Mapping[int, Identity]:
        """The identities, fetched: a plain mapping, whose lookups run in C (``plans._learned``)."""
        return self._load()

    def __getitem__(self, sid: int) -> Identity:
        return self._load()[sid]

    def get(self, sid: int, default: Any = None) -> Any:  # Mapping.get's try/except, a call less
        return self._load().get(sid, default)

    def __iter__(self) -> Iterator[int]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


class _Tail:
    """The raw points of the last batches stored, by point id.

    The detection loop reads every point ingest stores, right after it is stored; reading them
    back cost as much as storing them (docs/storage.md). Batches are appended after their commit,
    in commit order, so the tail holds every raw point with an id above ``floor``: ids are taken
    in commit order under the write lock, so the point before the first batch appended bounds
    everything stored earlier. Older entries are dropped past ``max_points`` and ``floor`` moves
    up with them. ``since`` answers only when it can answer exactly what the database would: the
    same points in id order (a batch's ids are consecutive, so a cursor inside a batch skips its
    first points).
    """

    def __init__(self, max_points: int) -> None:
        self._lock = threading.Lock()
        self._entries: deque[tuple[int, int, Chunk]] = deque()  # first id, last id, the batch
        self._points = 0
        self.floor: int | None = None  # None until the first batch: nothing to answer from yet
        self.max_points = max_points

    def append(self, batches: Sequence[Committed]) -> None:
        with self._lock:
            for b in batches:
                first = b.last_point_id - len(b.rows) + 1
                if self.floor is None:
                    self.floor = first - 1
                sids = b.sids or tuple(map(_SID, b.rows))
                self._entries.append((first, b.last_point_id, Chunk(b.node, b.rows, sids, b.ts)))
                self._points += len(b.rows)
            while self._points > self.max_points and len(self._entries) > 1:
                _first, last, old = self._entries.popleft()
                self._points -= len(old.rows)
                self.floor = last

    def newest(self) -> int | None:
        """The last appended point's id; None before the first batch."""
        with self._lock:
            return self._entries[-1][1] if self._entries else None

    def since(self, cursor: int, limit: int) -> tuple[list[Chunk], int] | None:
        """(each batch's ``Chunk``, cut to what the read takes, in id order; the next cursor), or
        None to read the database."""
        with self._lock:
            if self.floor is None or cursor < self.floor:
                return None
            out: list[Chunk] = []
            upto, taken = cursor, 0
            for first, last, chunk in self._entries:
                if last <= cursor:
                    continue
                skip = max(0, cursor - first + 1)
                if skip or len(chunk.rows) > limit - taken:
                    end = skip + limit - taken
                    chunk = chunk._replace(rows=chunk.rows[skip:end], sids=chunk.sids[skip:end])
                out.append(chunk)
                taken += len(chunk.rows)
                upto = first + skip + len(chunk.rows) - 1
                if taken >= limit:
                    break
            return out, upto
