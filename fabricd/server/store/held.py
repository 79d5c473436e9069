"""The writer's connection, kept from one transaction to the next (raw DBAPI).

A pool checkout per group cost a pre-ping round trip to PostgreSQL under the write lock (wall time
every batch waits for) and ~5 % of the store stage's CPU (bench/pipeline.py, 500 nodes, runs
alternated with the tree before: 2.88-3.13 -> 2.74-2.99 µs a sample; SQLite 4.46-4.63 -> 4.40-4.54).
After any failure the connection goes back to the pool, and the next transaction checks one out
afresh (pinged): a database restarted between two groups fails one group, which its agents retry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine


class HeldConnection:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._conn: Any = None  # a sqlalchemy Connection between transactions, else None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        """A raw cursor inside one transaction, committed on exit; the caller serializes (the
        write lock)."""
        if self._conn is None:
            self._conn = self.engine.connect()
        try:
            with self._conn.begin():
                cur = self._conn.connection.cursor()
                try:
                    yield cur
                finally:
                    cur.close()
        except BaseException:
            self.release()
            raise

    def release(self, invalidate: bool = False) -> None:
        """Let go of the connection: back to the pool, or closed for good (``invalidate``: the pool
        it came from was disposed)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a dead connection: the pool discards it
                if invalidate:
                    conn.invalidate()
                conn.close()
