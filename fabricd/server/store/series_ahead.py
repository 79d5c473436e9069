"""A node's new series stored ahead of the write lock, in a transaction of their own (PostgreSQL).

Over a fleet's first scrape on PostgreSQL the write lock was busy 67 % of the time, and 64 % of
that was PostgreSQL inserting the batches' new series (py-spy, 500 nodes of 480 series, AMD EPYC,
2026-12-07; docs/storage.md): every other batch waited on one backend's index inserts while the
second core idled. So the first batch of a node the writer has not cached yet (a new node, or any
node after a restart) reads the node's series and inserts the missing ones from its own ingest
thread, on one of a few connections kept for this, before it queues for the group commit: several
such batches run beside each other and beside the writer, and under the lock the batch finds every
series known.

What it changes, and why that is safe:

- The series commit before the batch's points, not with them. A batch refused after that (the
  database failed its group) leaves series without points, which its agent's retry finds and
  uses; a series row without points is what any series is between two scrapes. Nothing is stored
  twice: the identity's unique index holds across transactions.
- Two batches of one node (a retry beside its original, an agent draining its spool) take the
  node's transaction-scoped advisory lock in turn, so the second sees the first's series and the
  node's series count, which the ``max_series_per_node`` limit is checked against, is exact.
- The writer's listeners still hear of each series once, from the batch that created it (its
  ``Committed.series``); a batch refused after creating them leaves that to the identity cache's
  read of unknown ids (``Identities.of``).

SQLite has one writer per database, so there a transaction beside the writer's would only wait
for its lock: ``GroupCommitWriter`` keeps its series in the batch's transaction.
"""

from __future__ import annotations

import contextlib
import queue
import zlib
from dataclasses import dataclass, field
from typing import cast

from fabricd.model import Batch
from fabricd.server.store import new_series
from fabricd.server.store.batchrows import series_ids
from fabricd.server.store.held import HeldConnection
from fabricd.server.store.new_series import NodeSeries
from fabricd.server.store.records import SeriesRow
from fabricd.server.store.sql import Database

# The first key of the node's two-key advisory lock (kept below 2**31: PostgreSQL's int4);
# ``claims.py``'s partition and correlator locks use other first keys.
LOCK_SPACE = zlib.crc32(b"fabricd:series-ahead") & 0x7FFFFFFF
LOCK = "SELECT pg_advisory_xact_lock(%s, %s)"
# Transactions of this kind at once, each on a connection it keeps (as the writer does: a pool
# checkout pings the server first, a round trip a batch); more than the machine's cores only queue
# in PostgreSQL.
CONCURRENCY = 4


@dataclass(slots=True)
class Ahead:
    """A batch's node's series as stored once its new ones committed."""

    series: NodeSeries  # every series of the node, the batch's among them
    created: list[SeriesRow] = field(default_factory=list)  # the rows this transaction inserted

    @property
    def new(self) -> int:
        return len(self.created)


class SeriesAhead:
    def __init__(self, db: Database, concurrency: int = CONCURRENCY) -> None:
        self.db = db
        self._held: queue.SimpleQueue[HeldConnection] = queue.SimpleQueue()  # those not in use
        for _ in range(concurrency):
            self._held.put(HeldConnection(db.engine))

    def prepare(self, batch: Batch, limit: int, cached: NodeSeries | None) -> Ahead | None:
        """The node's series with the batch's new ones stored, for a node the writer has not
        ``cached``; None when the writer knows the node (its series, and a new one now and then,
        are the writer's to resolve). Raises ``SeriesLimitExceeded`` as the writer would, and the
        driver's error when the database fails (the batch is then refused: its agent retries)."""
        if cached is not None or not batch.samples:
            return None
        held = self._held.get()
        try:
            return self._store(held, batch, limit)
        finally:
            self._held.put(held)

    def _store(self, held: HeldConnection, batch: Batch, limit: int) -> Ahead:
        sql, created = self.db.sql, cast(list[SeriesRow], [])
        with held.transaction() as cur:
            cur.execute(LOCK, (LOCK_SPACE, zlib.crc32(batch.node.encode()) & 0x7FFFFFFF))
            known = new_series.load(cur, sql, batch.node)
            sids = series_ids(batch.samples, known.ids)
            if None not in sids:
                return Ahead(known)
            grown, _new, _sids = new_series.add(cur, sql, batch, limit, sids, known, created)
        return Ahead(grown, created)

    def release(self, invalidate: bool = False) -> None:
        """Let go of the kept connections not in use (``HeldConnection.release``); a transaction
        under way keeps its own (the writer's lets go of its own after a failure)."""
        idle = []
        with contextlib.suppress(queue.Empty):
            while True:
                idle.append(self._held.get_nowait())
        for held in idle:
            held.release(invalidate)
            self._held.put(held)
