"""Latest values: the newest point of every series, in memory, written back every few seconds (raw DBAPI).

``/metrics``, ``/api/v1/ports``, ``/api/v1/pingmesh`` and ``/api/v1/series`` show them. Updating
one series row per stored point made ingest pay a second, random write per point: on SQLite 2.2
of 5.8 us a point, on PostgreSQL 15 of 23 us (no HOT update fits in packed series pages, so each
update writes all three of its indexes), measured in docs/storage.md. Instead the writer's
post-commit hook (``committed``) updates memory, and ``flush`` writes what changed off the ingest
transaction. The newest point wins, as the old ``latest_ts <= v.ts`` condition did: a spooled
backlog drained after live data never replaces a newer value.

The durable copy is one row per node (``latest_chunks``, migration 0009): the node's newest points
packed as a raw-point chunk is (``chunks.pack``). Writing them back as one series row each cost
40 % of the server's CPU at steady state with a flush every second (an ``UPDATE`` a series:
its bound parameters under the GIL, then a B-tree seek and a page write of a wide row); a node's
row costs one pack and one write for its 480 series (docs/storage.md, "Latest values").
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from fabricd.model import Reading, Sample, Status
from fabricd.scrape_rows import STATUSES
from fabricd.server.store import chunks
from fabricd.server.store.identities import Identities, Identity
from fabricd.server.store.latest_memory import LatestMemory
from fabricd.server.store.latest_table import groups_of, newer_stored, newest, stored_rows
from fabricd.server.store.records import Committed, PointRow
from fabricd.server.store.sql import LATEST_CURSOR, Database


class LatestValues:
    def __init__(self, db: Database, identities: Identities) -> None:
        self.db, self.identities = db, identities
        self._mem = LatestMemory()
        # One flush at a time: SQLite packs a group before it takes the write lock, so a second
        # flush overlapping it could write an older snapshot over a newer one.
        self._flushing = threading.Lock()
        # node -> (its series count when they were sorted by source, the ids of each source asked
        # for): see ``_of_source``
        self._picks: dict[str, tuple[int, dict[str, tuple[int, ...]]]] = {}
        self._asked: set[str] = set()

    def committed(self, batches: Sequence[Committed]) -> None:
        """The writer's post-commit hook."""
        # The stored chunk is kept for SQLite's flush alone (``LatestMemory.packed``): PostgreSQL's
        # merges each node with its stored row first, and would only hold the chunks.
        serial = self.db.sql.serial_writes
        for b in batches:
            self._mem.apply(b.node, b.rows, ts=b.ts, sids=b.sids, packed=b.packed if serial else None)

    def values(
        self, node: str | None = None, source: str | None = None, fresh_since: float | None = None
    ) -> list[tuple[str, Sample]]:
        """The latest sample of each series (optionally of one node/source, seen since a time),
        ordered by node, then series id. ``/metrics`` calls this for the whole fleet on every
        scrape: no query, the values come from memory joined with the cached identities."""
        self.load()
        if source is None:
            rows = self._mem.rows(node, fresh_since)
        else:
            rows = self._mem.rows_of(self._of_source(source, node), fresh_since)
        return _samples(rows, self.identities.of({row[0] for row in rows}))

    def _of_source(self, source: str, node: str | None) -> dict[str, tuple[int, ...]]:
        """The ids of ``source``'s series, by node (of ``node`` alone if given).

        The detection loop's topology refresh asks for the LLDP and ibfabric series of every node
        every 10 s (three calls); picking them out of all series took 0.9-1.5 s of CPU a call at
        10,000 nodes of 480 series (synthetic), 0.4 s of it under the lock ingest applies to, and
        takes 0.07 s after the first call now. A node's series are only ever added to, so while
        its count is unchanged its picks stand, and only nodes with new series are sorted again."""
        if source not in self._asked:  # every node's picks lack it: sorted again, in one pass
            self._asked.add(source)
            self._picks.clear()
        picks, asked = self._picks, self._asked
        counts = self._mem.counts(node)
        stale = self._mem.sids([name for name, n in counts.items() if picks.get(name, (-1,))[0] != n])
        if stale:
            # One pass a series for every source asked (the LLDP and ibfabric ones): a pass per
            # source was 6 % of the central's GIL time over a fleet's first scrape (py-spy).
            idents = self.identities.of({sid for sids in stale.values() for sid in sids})
            for name, sids in stale.items():
                by: dict[str, list[int]] = {s: [] for s in asked}
                for sid in sids:
                    if (ident := idents.get(sid)) is not None and (mine := by.get(ident[1].source)) is not None:
                        mine.append(sid)
                picks[name] = (len(sids), {s: tuple(mine) for s, mine in by.items()})
        names = [node] if node is not None else list(picks)
        return {name: picks[name][1][source] for name in names if name in picks}

    def get(self, node: str, series_id: int) -> PointRow | None:
        self.load()
        return self._mem.get(node, series_id)

    def stored(self, nodes: Sequence[str]) -> dict[int, PointRow]:
        """The latest values of ``nodes`` as last written to the table, by series id."""
        with self.db.cursor() as cur:
            return newest(row for _node, rows in stored_rows(cur, self.db, nodes) for row in rows)

    def unflushed(self) -> int:
        """Series whose latest value is only in memory (``fabricd_store_latest_unflushed_series``)."""
        return self._mem.pending()

    def load(self) -> None:
        """Fill memory from the series table, then replay the raw points stored after the last
        flush (a crash loses no latest value). Once per process; the service calls it at start-up,
        and every reader first."""
        if self._mem.loaded:
            return
        with self.db.write_lock:
            if not self._mem.loaded:
                with self.db.cursor() as cur:
                    self._mem.load(cur, self.db)

    def flush(self, chunk: int = 20_000) -> int:
        """Write the nodes whose latest values changed since the last flush to the table (a row
        each, with every series of the node); returns how many series had changed.

        The point id cursor ``latest`` moves with the last group: every raw point up to it has its
        latest value in the table, and ``load`` replays the points after it. Nodes are written in
        groups of about ``chunk`` series; on SQLite each group's upsert takes the write lock (one
        writer; the group is packed before), so ingest waits for one upsert, never for the whole
        flush; PostgreSQL runs them beside ingest.
        """
        with self._flushing:
            return self._flush(chunk)

    def _flush(self, chunk: int) -> int:
        self.load()
        with self.db.write_lock:
            dirty = self._mem.take_dirty()
            upto = self.db.max_point_id()
        if not dirty and upto <= self._mem.flushed_upto:
            return 0
        groups = groups_of(sorted(dirty), self._mem.counts(None), chunk)
        try:
            for i, names in enumerate(groups):
                # One writer (SQLite): memory is never older than the table (``_merged``), so the
                # group is packed before the write lock is taken; ingest waits for the write alone.
                packed = self._mem.packed(names, _packed) if self.db.sql.serial_writes else None
                with self._chunk_cursor() as cur:
                    cur.executemany(self.db.sql.write_latest, self._merged(cur, names) if packed is None else packed)
                    if i == len(groups) - 1:
                        cur.execute(self.db.sql.upsert_cursor, (LATEST_CURSOR, upto))
        except BaseException:
            self._mem.restore_dirty(dirty)  # written groups are written again next time: harmless
            raise
        self._mem.flushed_upto = upto
        self._mem.written()
        return sum(len(sids) for sids in dirty.values())

    def _merged(self, cur: Any, names: list[str]) -> list[tuple[str, int, bytes]]:
        """Each node's row where another process may have written it (PostgreSQL): memory, merged
        with the stored row read ``FOR UPDATE``. A replica may hold an older view of a node another
        replica owned until a takeover, and the newer of the two wins for each series. (With one
        writer, SQLite, memory was loaded from the table and every later point went through it, so
        it is never older: ``flush`` packs it without reading.)"""
        if not names:
            return []
        mine = self._mem.snapshot(names)
        sql, params = self.db.sql.latest_of(names, True)
        cur.execute(sql, params)
        for node, count, blob in cur.fetchall():
            if newer := newer_stored(mine[node], bytes(blob), count, node):
                self._mem.apply(node, newer, dirty=False)
                mine[node].update((row[0], row) for row in newer)
        return _packed(mine)

    @contextlib.contextmanager
    def _chunk_cursor(self) -> Iterator[Any]:
        with self.db.side_write_lock(), self.db.cursor(transaction=True) as cur:
            yield cur


def _packed(mine: dict[str, dict[int, PointRow]]) -> list[tuple[str, int, bytes]]:
    """(node, count, packed rows) of each node with a latest value: ``write_latest``'s rows."""
    return [(node, len(rows), chunks.pack(list(rows.values()))[0]) for node, rows in mine.items() if rows]


def _samples(rows: Sequence[PointRow], idents: dict[int, Identity]) -> list[tuple[str, Sample]]:
    """(node, sample) of each (series id, ts, value, rate, status, since) row."""
    out: list[tuple[str, Sample]] = []
    append, statuses = out.append, STATUSES
    for sid, ts, value, rate, status, since in rows:
        node, b = idents[sid]
        r = Reading(b.source, b.device, b.port, b.counter, value, b.unit, b.kind, b.labels, b.name)
        append((node, Sample(ts, r, rate, statuses.get(status or "ok") or Status(status), since)))
    return out
