"""The stored sample stream as the correlator reads it among replicas: one cursor per bus partition.

A single central reads points in id order (``store.stream.Stream``): ids are taken in commit
order under its write lock, so nothing can appear below a cursor once read past. Among replicas
that holds per partition only: each partition has one writer at a time (the replica holding its
lock, fabricd/server/claims.py; HTTP ingest forwards to the bus, fabricd/server/forward.py), whose
commits are ordered, while two replicas' transactions commit in any order. So the correlator
keeps a cursor per partition, ``PartitionCursor``, saved as the ``cursors`` rows
``detection.p<N>``, and reads each partition's points past its own cursor.

A partition's points are those of its nodes (``nodes`` rows, partitioned by the agents' rule,
``BusNames.partition``), read from their batches' chunks, which carry their node
(``ChunkSQL.of_nodes``). A node's row commits with its first points, so the node list is read
again after the points: if it grew, the partition is read again with it (a new node's points
could otherwise lie below the cursor of a node already known).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fabricd.bus import BusNames
from fabricd.server.store.identities import Identities
from fabricd.server.store.plans import read_back
from fabricd.server.store.records import Delivery, Keep
from fabricd.server.store.sql import Database

_NO_END = 2**63 - 1


@dataclass(frozen=True)
class _Nodes:
    """A partition's nodes and the newest point id stored for any of them (None: unknown)."""

    names: list[str]
    newest: int | None


_NONE = _Nodes([], None)


@dataclass(frozen=True)
class PartitionCursor:
    """The last point id read of every partition (index = partition)."""

    ids: tuple[int, ...]

    def behind(self, head: int) -> int:
        """Points up to ``head`` not read yet, at most (the slowest partition's distance)."""
        return max(0, head - min(self.ids, default=head))


class PartitionedStream:
    """A ``SampleSource`` whose cursor is a ``PartitionCursor`` (the correlator's detection loop)."""

    def __init__(self, db: Database, identities: Identities, names: BusNames) -> None:
        self.db, self.identities, self.names = db, identities, names

    def read(
        self,
        cursor: PartitionCursor,
        limit: int = 20_000,
        upto: PartitionCursor | None = None,
        keep: Keep | None = None,
    ) -> tuple[list[Delivery], PartitionCursor]:
        """Each partition's points after its cursor (and up to ``upto``'s, when given), at most
        ``limit`` each: a partition that returns a full chunk makes the whole read not "whole"."""
        ends = upto.ids if upto is not None else (_NO_END,) * self.names.partitions

        def part(p: int, nodes: dict[int, _Nodes]) -> tuple[list[Delivery], int]:
            mine = nodes.get(p, _NONE)
            # No point of the partition lies above its nodes' newest (committed with the points, by
            # one writer at a time): stop there, and do not read a partition with nothing new.
            end = ends[p] if mine.newest is None else min(ends[p], mine.newest)
            return self._partition(mine.names, cursor.ids[p], end, limit, keep)

        before = self._nodes()
        found = {p: part(p, before) for p in range(self.names.partitions)}
        after = self._nodes()
        while changed := [p for p in found if after.get(p, _NONE).names != before.get(p, _NONE).names]:
            before = after  # nodes appeared meanwhile: read their partitions again with them
            found.update({p: part(p, after) for p in changed})
            after = self._nodes()
        out = [d for p in sorted(found) for d in found[p][0]]
        return out, PartitionCursor(tuple(found[p][1] for p in range(self.names.partitions)))

    def rewind(self, cursor: PartitionCursor, since_ts: float) -> PartitionCursor:
        """Each partition's cursor moved back before its first point stored since ``since_ts``."""
        nodes, ids = self._nodes(), list(cursor.ids)
        with self.db.cursor() as cur:
            for p, mine in nodes.items():
                first = self.db.sql.chunks.first_since(cur, mine.names, since_ts, ids[p])
                if first is not None:
                    ids[p] = min(ids[p], int(first) - 1)
        return PartitionCursor(tuple(ids))

    def _partition(
        self, nodes: list[str], after: int, end: int, limit: int, keep: Keep | None
    ) -> tuple[list[Delivery], int]:
        if not nodes or after >= end:
            return [], after
        with self.db.cursor() as cur:
            rows = self.db.sql.chunks.of_nodes(cur, nodes, after, end, limit)
            idents = self.identities.load(cur, {row[1] for row in rows})
        upto = rows[-1][0] if rows else after
        return read_back([row[1:] for row in rows], idents, keep), upto

    def _nodes(self) -> dict[int, _Nodes]:
        with self.db.cursor() as cur:
            cur.execute("SELECT name, last_point_id FROM nodes ORDER BY name")
            rows = cur.fetchall()
        names: dict[int, list[str]] = {}
        newest: dict[int, int | None] = {}
        for name, last in rows:
            p = self.names.partition(str(name))
            names.setdefault(p, []).append(str(name))
            # NULL: a node stored by a version that did not record it; its partition is read unbounded.
            was = newest.get(p, 0)
            newest[p] = None if last is None or was is None else max(was, int(last))
        return {p: _Nodes(names[p], newest[p]) for p in names}

    def partition_of(self, node: str) -> int:
        """The partition whose ordered stream holds ``node``'s points (``read_timing.ReadTiming``)."""
        return self.names.partition(node)

    def head(self) -> int:
        return self.db.max_point_id()

    def backlog(self, cursor: PartitionCursor) -> int:
        return cursor.behind(self.head())

    def cursor(self, name: str) -> PartitionCursor:
        with self.db.cursor() as cur:
            found = {}
            for p in range(self.names.partitions):
                cur.execute(self.db.sql.read_cursor, (_name(name, p),))
                row = cur.fetchone()
                found[p] = int(row[0]) if row else 0
        return PartitionCursor(tuple(found[p] for p in range(self.names.partitions)))

    def save_cursor(self, name: str, position: PartitionCursor) -> None:
        with self.db.cursor(transaction=True) as cur:
            cur.executemany(self.db.sql.upsert_cursor, _rows(name, position.ids))


def _name(name: str, partition: int) -> str:
    return f"{name}.p{partition}"


def _rows(name: str, ids: Sequence[int]) -> list[tuple[str, int]]:
    return [(_name(name, p), i) for p, i in enumerate(ids)]
