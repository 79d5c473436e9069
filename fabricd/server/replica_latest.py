"""Latest values on a replica: its own partitions from memory, every other node's from the table.

A replica's memory (``LatestValues``) follows its own writer only: the nodes of the partitions it
stores, exactly and at once. Another replica's nodes it knows only as their owner last wrote them
to the table (``latest_chunks``, every ``latest_flush_seconds``), so a REST read on any replica
shows them at most that old; after an owner is killed -9 the table keeps its last flush until the
new owner's first points of a series (docs/operations.md, "Replicas").
"""

from __future__ import annotations

from collections.abc import Callable

from fabricd.model import Sample
from fabricd.server.store.latest import LatestValues, _samples
from fabricd.server.store.latest_table import newest, stored_rows
from fabricd.server.store.records import PointRow


class ReplicaLatest(LatestValues):
    """``LatestValues`` sharing the memory of ``inner`` (the one the writer updates and flushes)."""

    def __init__(self, inner: LatestValues, owns: Callable[[str], bool]) -> None:
        super().__init__(inner.db, inner.identities)
        self._mem = inner._mem  # one memory: written by the writer, read here
        self.owns = owns  # node -> whether this replica stores it now

    def values(
        self, node: str | None = None, source: str | None = None, fresh_since: float | None = None
    ) -> list[tuple[str, Sample]]:
        mine = [(n, s) for n, s in super().values(node, source, fresh_since) if self.owns(n)]
        others = [(n, s) for n, s in self._table(node, source, fresh_since) if not self.owns(n)]
        return sorted([*mine, *others], key=lambda pair: pair[0])  # by node; stable: ids stay in order

    def get(self, node: str, series_id: int) -> PointRow | None:
        """Only for an owned node: another's is in the table (``stored``)."""
        return super().get(node, series_id) if self.owns(node) else None

    def _table(self, node: str | None, source: str | None, fresh_since: float | None) -> list[tuple[str, Sample]]:
        with self.db.cursor() as cur:
            wanted = None
            if source is not None:
                # The topology's LLDP lookup (every detection topology check) wants a few hundred
                # series: their ids from the series table first, so only their rows are unpacked
                # and no other series' identity is learned.
                sql, params = f"SELECT id FROM series WHERE source = {self.db.sql.mark}", [source]
                if node is not None:
                    sql, params = f"{sql} AND node = {self.db.sql.mark}", [source, node]
                cur.execute(sql, params)
                wanted = {sid for (sid,) in cur.fetchall()}
            by_node: dict[str, list[PointRow]] = {}
            for name, rows in stored_rows(cur, self.db, None if node is None else [node], wanted):
                by_node.setdefault(name, []).extend(rows)
            rows = [
                row
                for name in sorted(by_node)
                for row in sorted(newest(by_node[name]).values())
                if fresh_since is None or row[1] >= fresh_since
            ]
            idents = self.identities.load(cur, {row[0] for row in rows})
        return _samples(rows, idents)
