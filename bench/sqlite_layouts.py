"""How to keep raw points in SQLite: a row per point against a chunk per batch, side by side.

docs/storage.md ("Raw points in chunks") chooses the layout from these numbers. Both write the same
point rows (the service's ``PointRow``), one transaction per batch of one node's scrape (480 rows)
with the service's pragmas (WAL, ``synchronous=FULL``), through the service's own writers: rows in
multi-row ``VALUES`` statements (``sqlite.ManyRows``, the writer before migration 0008) into
``points`` with its two indexes, chunks through ``sqlite.CHUNKS`` (the service's writer) into ``point_chunks``.
Reported per point: this thread's CPU (``time.thread_time``) and wall time to store, the CPU to
read every point back in id order (the detection stream's database path), and the database file's
size (indexes included, the WAL checkpointed).

    python bench/sqlite_layouts.py [--batches 1000] [--runs 3]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fabricd.server.store import chunks, sqlite
from fabricd.server.store.sqlite import ManyRows

T0 = 1_700_000_000.0
PER_BATCH = 480
ROWS = ManyRows(
    "INSERT INTO points (series_id, ts, value, rate, status, since, step) VALUES {values}", "(?, ?, ?, ?, ?, ?, 0.0)"
)
SCHEMA = {
    "rows": [
        "CREATE TABLE points (id INTEGER PRIMARY KEY, series_id INTEGER, ts FLOAT, value FLOAT, rate FLOAT, "
        "status VARCHAR(16), since FLOAT, step FLOAT)",
        "CREATE INDEX ix_points_series_ts ON points (series_id, ts)",
        "CREATE INDEX ix_points_step_ts ON points (step, ts)",
    ],
    "chunks": [
        f"CREATE TABLE {chunks.TABLE} (id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, count INTEGER NOT NULL, "
        "node TEXT NOT NULL, ts_min FLOAT NOT NULL, ts_max FLOAT NOT NULL, points BLOB NOT NULL, ids BLOB)",
        f"CREATE INDEX ix_point_chunks_node_ts ON {chunks.TABLE} (node, ts_min, ts_max)",
        f"CREATE INDEX ix_point_chunks_ts ON {chunks.TABLE} (ts_min, node)",
    ],
}


def batches(n: int) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """``n`` batches of one node's scrape: 480 series, counters moving, 100 nodes a scrape."""
    out = []
    for b in range(n):
        node, scrape = b % 100, b // 100
        ts = T0 + 10.0 * scrape
        rows = [(node * PER_BATCH + s, ts, float(scrape * 1000 + s), float(s), "ok", None) for s in range(PER_BATCH)]
        out.append((f"node-{node:03d}", rows))
    return out


def measure(layout: str, data: list[tuple[str, list[tuple[Any, ...]]]]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(Path(tmp) / "points.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")  # as the service: acknowledged = durable
        for statement in SCHEMA[layout]:
            conn.execute(statement)
        cur = conn.cursor()
        writer = sqlite.CHUNKS
        cpu, wall = time.thread_time(), time.perf_counter()
        for node, rows in data:
            cur.execute("BEGIN")
            if layout == "rows":
                ROWS.changes(cur, rows)
            else:
                writer.write(cur, node, rows)
            cur.execute("COMMIT")
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        read = time.thread_time()
        if layout == "rows":
            cur.execute("SELECT id, series_id, ts, value, rate, status, since FROM points WHERE step = 0.0 ORDER BY id")
            back = len(cur.fetchall())
        else:
            back = len(sqlite.CHUNKS.after(cur, 0, 1 << 62))
        read = time.thread_time() - read
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = conn.execute("PRAGMA page_count").fetchone()[0] * conn.execute("PRAGMA page_size").fetchone()[0]
        conn.close()
    points = sum(len(rows) for _node, rows in data)
    assert back == points
    return {
        "store_cpu": cpu / points * 1e6,
        "store_wall": wall / points * 1e6,
        "read_cpu": read / points * 1e6,
        "bytes": size / points,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    data = batches(args.batches)
    results: dict[str, list[dict[str, float]]] = {"rows": [], "chunks": []}
    for _ in range(args.runs):  # alternated, so a change of the machine's speed hits both
        for layout in results:
            results[layout].append(measure(layout, data))
    print(f"{args.batches} batches x {PER_BATCH} points, medians of {args.runs} runs, µs a point")
    print("| layout | store CPU | store wall | read back CPU | file bytes a point |\n|---|---|---|---|---|")
    for layout, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"| {layout} | {med['store_cpu']:.2f} | {med['store_wall']:.2f} | {med['read_cpu']:.2f} | {med['bytes']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
