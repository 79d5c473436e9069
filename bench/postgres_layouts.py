"""How to keep raw points in PostgreSQL: a row per point against a chunk per batch, side by side.

The counterpart of ``bench/sqlite_layouts.py`` for PostgreSQL, which chose chunks there too
(docs/storage.md, "PostgreSQL's share of a sample"; migration 0011). Both layouts are range
partitioned on event time, as ``partitions.py`` keeps its tables, and get the same point rows
(the service's ``PointRow``) in batches of one node's scrape (480 rows), one transaction a batch
(``--group``: as many as the writer's group commit puts in one):

- ``rows``: ``points`` made by the service's own ``partitions.create_parent`` and
  ``partitions.create`` (primary key (id, ts), index (series_id, ts)), the rows written by the
  ``COPY .. (FORMAT BINARY)`` writer the service used before migration 0011 (``copy_rows``);
- ``chunks``: ``point_chunks`` partitioned on ``ts_min``, primary key (id, ts_min), index (node,
  ts_min), one row a batch whose points are packed by ``chunks.pack`` (SQLite's layout), the blob
  left to TOAST's defaults (``pglz``); ``chunks_lz4`` and ``chunks_plain`` the same with the blob
  compressed by ``lz4``, or stored out of line uncompressed (``STORAGE EXTERNAL``).

Reported per point: this client's CPU (``time.thread_time``) and the PostgreSQL server's (every
``postgres`` process of the machine, read from /proc: the backend, the WAL writer, the
checkpointer), the wall time, the client's CPU to read every point back in id order, and the
partitions' size (indexes and TOAST included). Run it on a quiet machine: the server's CPU is
read machine-wide.

    python bench/postgres_layouts.py [--batches 1000] [--runs 3] [--dsn postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import psycopg
import sqlalchemy
from measure import postgres_cpu_seconds
from sqlite_layouts import PER_BATCH, T0, batches

from fabricd.server.store import chunks, partitions

# The point rows' columns (``records.PointRow``) and their types for a binary COPY.
COPY_ROWS = "COPY points (series_id, ts, value, rate, status, since) FROM STDIN (FORMAT BINARY)"
COPY_TYPES = ["int8", "float8", "float8", "float8", "text", "float8"]


def copy_rows(cur: Any, rows: list[tuple[Any, ...]]) -> None:
    """A batch's points as rows, by binary ``COPY`` through psycopg's C writer: 1.2-1.4 µs of client
    CPU a point against 3.7 for ``unnest(arrays)`` and 17 for ``executemany`` (docs/storage.md)."""
    with cur.copy(COPY_ROWS) as copy:
        copy.set_types(COPY_TYPES)
        for row in rows:
            copy.write_row(row)


DAY = 86400.0
SCHEMA = {
    "rows": ["CREATE SEQUENCE points_id_seq"],  # then the service's own partitioned ``points`` (``create``)
    "chunks": [
        f"CREATE TABLE {chunks.TABLE} (id BIGINT NOT NULL, count INT NOT NULL, node TEXT NOT NULL, "
        "ts_min FLOAT8 NOT NULL, ts_max FLOAT8 NOT NULL, points BYTEA NOT NULL, ids BYTEA, "
        "PRIMARY KEY (id, ts_min)) PARTITION BY RANGE (ts_min)",
        f"CREATE INDEX ix_point_chunks_node_ts ON {chunks.TABLE} (node, ts_min)",
        f"CREATE TABLE point_chunks_p PARTITION OF {chunks.TABLE} FOR VALUES FROM ({T0 - DAY}) TO ({T0 + DAY})",
    ],
}
# The blob's TOAST settings (PostgreSQL compresses a value over ~2 KB with pglz by default; a
# chunk of 480 points is 19,680 bytes): lz4, or stored out of line uncompressed.
SCHEMA["chunks_lz4"] = [*SCHEMA["chunks"], "ALTER TABLE point_chunks_p ALTER COLUMN points SET COMPRESSION lz4"]
SCHEMA["chunks_plain"] = [*SCHEMA["chunks"], "ALTER TABLE point_chunks_p ALTER COLUMN points SET STORAGE EXTERNAL"]
INSERT_CHUNK = f"INSERT INTO {chunks.TABLE} (id, count, node, ts_min, ts_max, points) VALUES (%s, %s, %s, %s, %s, %b)"
PARENT = {"rows": "points"}


def create(layout: str, url: str) -> None:
    """The layout's tables; ``points`` exactly as the service creates it (``partitions.py``: the
    parent, its indexes and default partition, and one time partition around the data)."""
    engine = sqlalchemy.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as conn:
            for statement in SCHEMA[layout]:
                conn.exec_driver_sql(statement)
            if layout == "rows":
                partitions.create_parent(conn)
                partitions.create(conn, T0 - DAY, T0 + DAY)
    finally:
        engine.dispose()


def measure(layout: str, data: list[tuple[str, list[tuple[Any, ...]]]], dsn: str, group: int) -> dict[str, float]:
    name = f"fabricd_layouts_{os.getpid()}"
    admin = psycopg.connect(dsn, autocommit=True)
    admin.execute(f"DROP DATABASE IF EXISTS {name}")
    admin.execute(f"CREATE DATABASE {name}")
    try:
        url = dsn.rsplit("/", 1)[0] + f"/{name}"
        create(layout, url)
        with psycopg.connect(url) as conn:
            cur = conn.cursor()
            last_id = 0
            cpu, server, wall = time.thread_time(), postgres_cpu_seconds(), time.perf_counter()
            for i, (node, rows) in enumerate(data, 1):
                if layout == "rows":
                    copy_rows(cur, rows)
                else:
                    blob, ts_min, ts_max = chunks.pack(rows)
                    last_id += len(rows)
                    cur.execute(INSERT_CHUNK, (last_id, len(rows), node, ts_min, ts_max, blob))
                if i % group == 0 or i == len(data):  # the service's group commit: ``group`` batches a commit
                    conn.commit()
            wall = time.perf_counter() - wall
            cpu, server = time.thread_time() - cpu, postgres_cpu_seconds() - server
            read = time.thread_time()
            if layout == "rows":
                cur.execute("SELECT id, series_id, ts, value, rate, status, since FROM points ORDER BY id")
                back = len(cur.fetchall())
            else:
                cur.execute(f"SELECT id, count, points, ids FROM {chunks.TABLE} ORDER BY id")
                back = sum(len(chunks.unpack(i, n, bytes(blob), ids)) for i, n, blob, ids in cur.fetchall())
            read = time.thread_time() - read
            size = cur.execute(
                "SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(%s::regclass)",
                (PARENT.get(layout, chunks.TABLE),),
            ).fetchone()[0]
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()
    points = sum(len(rows) for _node, rows in data)
    assert back == points, (layout, back, points)
    return {
        "client_cpu": cpu / points * 1e6,
        "server_cpu": server / points * 1e6,
        "wall": wall / points * 1e6,
        "read_cpu": read / points * 1e6,
        "bytes": int(size) / points,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--group", type=int, default=1, help="batches a transaction (the writer's group commit)")
    args = ap.parse_args()
    data = batches(args.batches)
    results: dict[str, list[dict[str, float]]] = {layout: [] for layout in SCHEMA}
    for _ in range(args.runs):  # alternated, so a change of the machine's speed hits both
        for layout in results:
            results[layout].append(measure(layout, data, args.dsn, args.group))
    print(
        f"{args.batches} batches x {PER_BATCH} points, {args.group} a transaction, medians of {args.runs} runs, µs a point"
    )
    print("| layout | client CPU | server CPU | wall | read back CPU | bytes a point |\n|---|---|---|---|---|---|")
    for layout, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"| {layout} | {med['client_cpu']:.2f} | {med['server_cpu']:.2f} | {med['wall']:.2f} "
            f"| {med['read_cpu']:.2f} | {med['bytes']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
