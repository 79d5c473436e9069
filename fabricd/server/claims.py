"""Who owns what among the central's replicas: PostgreSQL session advisory locks (psycopg 3).

A replica holds one connection of its own (``Claims``) and, on it, one advisory lock per bus
partition it serves and, on one replica only, the correlator's lock. A session lock lives as long
as the session: a replica killed -9 closes its socket, the server ends the session and every lock
it held is free at once. A replica that hangs or loses the network keeps its socket open; the
lease bounds that case: the session is set up so that the server drops it after ``lease_seconds``
of silence (``tcp_keepalives_*`` and ``tcp_user_timeout``, PostgreSQL's runtime-config-connection),
or of no heartbeat from a process that hangs while its kernel still answers (``idle_session_timeout``,
runtime-config-client), and the replica's own heartbeat fails within the same bound, so it stops
consuming (``Replica`` in fabricd/server/replica.py). Between the server ending a slow replica's
session and that replica's next heartbeat (a third of a lease), it may still store a batch of a
partition another replica claimed: the batch id check keeps it from being stored twice.

Nothing is written to claim: ``pg_locks`` joined with ``pg_stat_activity.application_name`` (which
names the replica) is the ownership table, and any replica reads it for the status API.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

APP_NAME = "fabricd-replica"


def lock_space(prefix: str, what: str) -> int:
    """The first key of a two-key advisory lock: one space per deployment (bus prefix) and role.
    Kept below 2**31 so the signed int4 PostgreSQL takes equals the oid ``pg_locks.classid`` shows."""
    return zlib.crc32(f"fabricd:{prefix}:{what}".encode()) & 0x7FFFFFFF


@dataclass(frozen=True)
class Ownership:
    """Partition -> replica id, the correlator's replica id, and every live replica."""

    partitions: dict[int, str]
    correlator: str | None
    replicas: list[str]


class Claims:
    """Advisory locks on one session of this replica's; every method may raise the driver's error
    (the session is gone: the caller drops every claim it thought it had)."""

    def __init__(self, conninfo: str, prefix: str, replica_id: str, lease_seconds: float) -> None:
        self.conninfo, self.prefix, self.replica_id, self.lease = conninfo, prefix, replica_id, lease_seconds
        self.partition_space, self.correlator_space = lock_space(prefix, "partition"), lock_space(prefix, "correlator")
        self._conn: Any = None

    def connect(self) -> None:
        import psycopg

        third = max(1, int(self.lease / 3))
        self._conn = psycopg.connect(
            self.conninfo,
            autocommit=True,
            application_name=app_name(self.prefix, self.replica_id),
            connect_timeout=third,
            # libpq's side: this replica notices a dead server within the lease too
            keepalives=1,
            keepalives_idle=third,
            keepalives_interval=1,
            keepalives_count=third,
            tcp_user_timeout=int(self.lease * 1000),
        )
        with self._conn.cursor() as cur:
            # The server's side: it ends this session (and frees its locks) after a lease of silence.
            for name, value in (
                ("tcp_keepalives_idle", third),
                ("tcp_keepalives_interval", 1),
                ("tcp_keepalives_count", third),
                ("tcp_user_timeout", int(self.lease * 1000)),
                ("statement_timeout", int(self.lease * 500)),
                # A replica alive on the network but stuck (its kernel still answers keepalives)
                # sends no heartbeat: the server ends the session once it has been idle a lease.
                ("idle_session_timeout", int(self.lease * 1000)),
            ):
                cur.execute(f"SET {name} = {int(value)}")

    def heartbeat(self) -> None:
        self._one("SELECT 1")

    def try_claim(self, partition: int) -> bool:
        return bool(self._one("SELECT pg_try_advisory_lock(%s, %s)", (self.partition_space, partition)))

    def release(self, partition: int) -> None:
        self._one("SELECT pg_advisory_unlock(%s, %s)", (self.partition_space, partition))

    def try_lead(self) -> bool:
        return bool(self._one("SELECT pg_try_advisory_lock(%s, 0)", (self.correlator_space,)))

    def ownership(self) -> Ownership:
        with self._conn.cursor() as cur:
            return ownership(cur, self.prefix)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken: the server frees the locks with the session
                pass

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if self._conn is None:
            raise ConnectionError("no claims session")
        with self._conn.cursor() as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
        return row[0] if row else None


def app_name(prefix: str, replica_id: str) -> str:
    return f"{APP_NAME} {prefix} {replica_id}"


_OWNERS = """
SELECT l.classid::bigint, l.objid::bigint, a.application_name FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid::bigint IN (%s, %s)
AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
_MEMBERS = (
    "SELECT DISTINCT application_name FROM pg_stat_activity WHERE datname = current_database() "
    "AND application_name LIKE %s"
)


def ownership(cur: Any, prefix: str) -> Ownership:
    """Who holds which lock now, read on any PostgreSQL cursor (the status API's source)."""
    parts, lead = lock_space(prefix, "partition"), lock_space(prefix, "correlator")
    head = app_name(prefix, "")
    cur.execute(_OWNERS, (parts, lead))
    partitions: dict[int, str] = {}
    correlator = None
    for space, key, app in cur.fetchall():
        who = str(app).removeprefix(head)
        if space == parts:
            partitions[int(key)] = who
        else:
            correlator = who
    cur.execute(_MEMBERS, (head.replace("_", r"\_").replace("%", r"\%") + "%",))
    replicas = sorted(str(app).removeprefix(head) for (app,) in cur.fetchall())
    return Ownership(dict(sorted(partitions.items())), correlator, replicas)
