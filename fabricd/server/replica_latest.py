"""Latest values on a replica: its own partitions from memory, every other node's from the table.

A replica's memory (``LatestValues``) follows its own writer only: the nodes of the partitions it
stores, exactly and at once. Another replica's nodes it knows only as their owner last wrote them
to the series table (``latest_*``, every ``latest_flush_seconds``), so a REST read on any replica
shows them at most that old; after an owner is killed -9 the table keeps its last flush until the
new owner's first points of a series (docs/operations.md, "Replicas").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fabricd.model import Sample
from fabricd.server.store.latest import LatestValues, _samples
from fabricd.server.store.records import PointRow

_TABLE = (
    "SELECT node, id, latest_ts, latest_value, latest_rate, latest_status, latest_since FROM series "
    "WHERE latest_ts IS NOT NULL AND latest_value IS NOT NULL"
)


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
        """Only for an owned node: otherwise the caller's table row is the newest there is."""
        return super().get(node, series_id) if self.owns(node) else None

    def _table(self, node: str | None, source: str | None, fresh_since: float | None) -> list[tuple[str, Sample]]:
        sql, params = _TABLE, list[Any]()
        if node is not None:
            sql, params = sql + " AND node = %s", [node]
        if fresh_since is not None:
            sql, params = sql + " AND latest_ts >= %s", [*params, fresh_since]
        if source is not None:
            # In the query: the topology's LLDP lookup (every detection topology check) fetched
            # every series of the fleet, and learned each one's identity, to keep a few hundred.
            sql, params = sql + " AND source = %s", [*params, source]
        with self.db.cursor() as cur:
            cur.execute(sql + " ORDER BY node, id", params)
            rows: list[Any] = cur.fetchall()
            idents = self.identities.load(cur, {row[1] for row in rows})
        return _samples([tuple(row[1:]) for row in rows], idents)
