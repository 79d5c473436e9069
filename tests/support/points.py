"""Every raw point a database holds: chunks (``fabricd/server/store/chunks.py``, read through the
dialect's ``chunk_reads.ChunkSQL``) and, on a database from before the chunks (SQLite before
migration 0008, PostgreSQL before 0011), rows of ``points``; for tests that count or compare what
was stored."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from fabricd.server.store import chunks, postgres, sqlite

ALL = 1 << 62
RawPoint = tuple[
    int, int, float, float, float | None, str, float | None
]  # id, series id, ts, value, rate, status, since


def raw_points(engine: Engine) -> list[RawPoint]:
    """(id, series id, ts, value, rate, status, since) of every raw point, in id order."""
    with engine.connect() as conn:
        return raw_points_of(conn.connection.driver_connection)


def raw_points_of(dbapi: Any) -> list[RawPoint]:
    """The same from a DBAPI connection (sqlite3 or psycopg)."""
    pg = type(dbapi).__module__.startswith("psycopg")
    cur = dbapi.cursor()
    try:
        if _has_chunks(pg, cur):
            return [tuple(p) for p in (postgres.CHUNKS if pg else sqlite.CHUNKS).after(cur, 0, ALL)]
        cur.execute("SELECT id, series_id, ts, value, rate, status, since FROM points WHERE step = 0.0 ORDER BY id")
        return [tuple(r) for r in cur.fetchall()]
    finally:
        cur.close()


def raw_points_by_series(dbapi: Any) -> list[tuple[str, str, str, str, str, float]]:
    """(node, source, device, port, counter, ts) of every raw point, in id order."""
    cur = dbapi.cursor()
    cur.execute("SELECT id, node, source, device, port, counter FROM series")
    series = {r[0]: tuple(r[1:]) for r in cur.fetchall()}
    cur.close()
    return [(*series[p[1]], p[2]) for p in raw_points_of(dbapi)]


def _has_chunks(pg: bool, cur: Any) -> bool:
    if pg:
        cur.execute("SELECT to_regclass(%s)", (chunks.TABLE,))
        return cur.fetchone()[0] is not None
    cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (chunks.TABLE,))
    return cur.fetchone() is not None


def written_latest(conn: Any) -> dict[int, tuple[Any, ...]]:
    """Series id -> (series id, ts, value, rate, status, since) of the latest values as written to
    the table (``latest_chunks``: a packed row per node) on a SQLAlchemy connection."""
    from sqlalchemy import text

    rows = conn.execute(text("SELECT count, points FROM latest_chunks")).all()
    return {row[0]: row for count, blob in rows for row in chunks.rows(bytes(blob), count)}
