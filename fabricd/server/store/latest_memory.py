"""The latest values in memory: the newest point row of every series, by node, and which of them
a flush has still to write (``LatestValues`` in ``latest.py`` serves and writes them)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Any

from fabricd.server.store.latest_table import stored_rows
from fabricd.server.store.records import PointRow
from fabricd.server.store.sql import LATEST_CURSOR, Database

_SID, _TS = itemgetter(0), itemgetter(1)  # a point row's series id and event time


class LatestMemory:
    """The newest point row of every series, by node; all methods are thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_node: dict[str, dict[int, PointRow]] = {}
        self._newest: dict[str, float] = {}  # the newest event time among each node's values
        self._dirty: dict[str, set[int]] = {}  # series changed since the last flush, by node
        self._writing: dict[str, set[int]] = {}  # taken by the flush under way, not yet written
        # node -> (count, its values packed), while they are exactly one stored batch's rows: the
        # writer's chunk of that batch (``packed``)
        self._packed: dict[str, tuple[int, bytes]] = {}
        self.loaded = False
        self.flushed_upto = 0  # the point id cursor as of the last flush or load

    def apply(
        self,
        node: str,
        rows: Sequence[PointRow],
        dirty: bool = True,
        ts: float | None = None,
        sids: Sequence[int] = (),
        packed: bytes | None = None,
    ) -> None:
        """Keep each row that is its series' newest. ``ts``: every row's event time, when the
        caller knows the batch is one scrape; ``sids``: the rows' series ids, in order, if known
        (the writer's ``Committed`` carries both, which spares two passes over the rows);
        ``packed``: the rows as the writer packed them in their chunk."""
        if ts is not None:
            lo = hi = ts
        else:
            times = list(map(_TS, rows))
            lo, hi = (min(times), max(times)) if times else (math.inf, -math.inf)
        with self._lock:
            mine = self._by_node.get(node)
            if mine is None:
                mine = self._by_node[node] = {}
            changed = self._dirty.setdefault(node, set()) if dirty else set()
            newest = self._newest.get(node, -math.inf)
            if rows and lo == hi >= newest:
                # One scrape at or after every value the node holds, as live batches are: each row
                # replaces its series' (as below: on a tie the later point wins), in C. The loop
                # below was 5 % of the central's GIL time at 480 samples a batch (py-spy).
                ids = sids if len(sids) == len(rows) else list(map(_SID, rows))
                mine.update(zip(ids, rows, strict=True))
                changed.update(ids)
                self._keep_packed(node, mine, ids, packed)
            else:
                self._packed.pop(node, None)
                for row in rows:
                    old = mine.get(row[0])
                    if old is None or old[1] <= row[1]:  # on a tie the later point wins, as the table did
                        mine[row[0]] = row
                        changed.add(row[0])
            if rows and hi > newest:
                self._newest[node] = hi
            if dirty and not changed:
                del self._dirty[node]

    def _keep_packed(self, node: str, mine: dict[int, PointRow], ids: Sequence[int], packed: bytes | None) -> None:
        """Keep ``packed`` as the node's values when the batch just taken whole holds every one
        of them, each once; else forget the node's."""
        if packed is not None and len(mine) == len(ids) == len(set(ids)):
            self._packed[node] = (len(ids), packed)
        else:
            self._packed.pop(node, None)

    def load(self, cur: Any, db: Database) -> None:
        cur.execute(db.sql.read_cursor, (LATEST_CURSOR,))
        found = cur.fetchone()
        upto = int(found[0]) if found else 0
        for node, group in stored_rows(cur, db, None):
            self.apply(node, group, dirty=False)
        # Stored after the last flush: a crash, or a kill -9.
        for node, group in db.sql.chunks.replay(cur, upto):
            self.apply(node, group)
        self.flushed_upto = upto
        self.loaded = True

    def rows(self, node: str | None, fresh_since: float | None) -> list[PointRow]:
        with self._lock:
            nodes = [node] if node is not None else sorted(self._by_node)
            out: list[PointRow] = []
            for name in nodes:
                out.extend(_in_order(self._by_node.get(name, {}).values(), fresh_since))
            return out

    def rows_of(self, picks: dict[str, tuple[int, ...]], fresh_since: float | None) -> list[PointRow]:
        """As ``rows``, of the series ids ``picks`` names by node."""
        with self._lock:
            out: list[PointRow] = []
            for name in sorted(picks):
                mine = self._by_node.get(name, {})
                out.extend(_in_order((row for sid in picks[name] if (row := mine.get(sid)) is not None), fresh_since))
            return out

    def counts(self, node: str | None) -> dict[str, int]:
        """How many series every node has (``node`` alone if given)."""
        with self._lock:
            names = [node] if node is not None else list(self._by_node)
            return {name: len(self._by_node[name]) for name in names if name in self._by_node}

    def sids(self, names: Sequence[str]) -> dict[str, list[int]]:
        """The series ids of each of ``names``."""
        with self._lock:
            return {name: list(self._by_node[name]) for name in names if name in self._by_node}

    def get(self, node: str, sid: int) -> PointRow | None:
        with self._lock:
            return self._by_node.get(node, {}).get(sid)

    def snapshot(self, names: Sequence[str]) -> dict[str, dict[int, PointRow]]:
        """A copy of the rows of each of ``names``."""
        with self._lock:
            return {name: dict(self._by_node.get(name, {})) for name in names}

    def packed(
        self, names: Sequence[str], pack: Callable[[dict[str, dict[int, PointRow]]], list[tuple[str, int, bytes]]]
    ) -> list[tuple[str, int, bytes]]:
        """(node, count, packed values) of each of ``names`` with values, for the flush to write:
        a node's values that are exactly its last batch's rows are that batch's chunk, as the
        writer packed it. Packing every node's values again was 12 % of the central's GIL time at
        1,000 nodes with a flush every second (py-spy, 2026-12-06). The rest go through ``pack``
        (a copy of their rows, taken under the lock). The chunks handed out are forgotten: the
        node's next batch brings a new one, and a failed flush packs its rows again."""
        with self._lock:
            whole = {name: got for name in names if (got := self._packed.pop(name, None)) is not None}
            rest = {name: dict(self._by_node.get(name, {})) for name in names if name not in whole}
        done = {node: (node, count, blob) for node, count, blob in pack(rest)} if rest else {}
        done.update((node, (node, count, blob)) for node, (count, blob) in whole.items())
        return [done[name] for name in names if name in done]

    def take_dirty(self) -> dict[str, set[int]]:
        with self._lock:
            dirty, self._dirty = self._dirty, {}
            self._writing = dirty
            return dirty

    def written(self) -> None:
        """The flush that took the dirty series has written them all."""
        with self._lock:
            self._writing = {}

    def restore_dirty(self, dirty: dict[str, set[int]]) -> None:
        with self._lock:
            for node, sids in dirty.items():
                self._dirty.setdefault(node, set()).update(sids)
            self._writing = {}

    def pending(self) -> int:
        """Changed series not yet in the table: those a flush under way is writing count until
        it has written them, so the gauge never reads 0 while they are still only in memory."""
        with self._lock:
            if not self._writing:
                return sum(len(sids) for sids in self._dirty.values())
            nodes = self._dirty.keys() | self._writing.keys()
            return sum(len(self._dirty.get(n, set()) | self._writing.get(n, set())) for n in nodes)


def _in_order(rows: Iterable[PointRow], fresh_since: float | None) -> list[PointRow]:
    """``rows`` seen since ``fresh_since`` (all if None), by series id (ids are unique: the tuples
    never compare further)."""
    return sorted(rows if fresh_since is None else (r for r in rows if r[1] >= fresh_since))
