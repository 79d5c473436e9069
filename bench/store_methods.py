"""How to put points into PostgreSQL: the bulk methods and table layouts measured side by side.

docs/storage.md chooses the service's method from these numbers. Each method writes the same point
rows (the service's ``PointRow`` plus ``step``) into a fresh table, one transaction per batch of
one node's scrape (480 rows), as the service commits them. Wall samples/s and the client's CPU per
row (``time.process_time``: what the replica's one Python core pays) are both kept, because on
this machine the server and the client share two cores.

    python bench/store_methods.py [--rows 200000] [--batch 480] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PG = "postgresql://postgres@127.0.0.1:5432/test"
T0 = 1_700_000_000.0
COLUMNS = "series_id, ts, value, rate, status, since, step"
TYPES = ["int8", "float8", "float8", "float8", "text", "float8", "float8"]
Row = tuple[Any, ...]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import pid_cpu_seconds  # noqa: E402 (the bench folder is not a package)


def point_rows(n: int, per_batch: int, scrape_seconds: float = 10.0) -> list[list[Row]]:
    """``n`` rows in batches of ``per_batch``: one batch per node and scrape, 480 series a node."""
    batches: list[list[Row]] = []
    rows: list[Row] = []
    for i in range(n):
        node, series = i // per_batch, i % per_batch
        scrape = node // 1000
        ts = T0 + scrape * scrape_seconds + (node % 1000) * 0.001
        rows.append(((node % 1000) * per_batch + series, ts, float(i), float(series), "ok", None, 0.0))
        if len(rows) == per_batch:
            batches.append(rows)
            rows = []
    if rows:
        batches.append(rows)
    return batches


# --- layouts ---------------------------------------------------------------------------------


def _flat(cur: Any, indexes: bool) -> None:
    cur.execute(
        "CREATE TABLE bench_points (id BIGSERIAL PRIMARY KEY, series_id BIGINT NOT NULL, ts FLOAT8 NOT NULL, "
        "value FLOAT8 NOT NULL, rate FLOAT8, status VARCHAR(16) NOT NULL, since FLOAT8, step FLOAT8 NOT NULL)"
    )
    if indexes:
        cur.execute("CREATE INDEX ON bench_points (series_id, ts)")
        cur.execute("CREATE INDEX ON bench_points (step, ts)")


def _partitioned_parent(cur: Any) -> None:
    """The partitioned points table as the service has it (migration 0005), with no partitions."""
    cur.execute("CREATE SEQUENCE bench_points_id_seq")
    cur.execute(
        "CREATE TABLE bench_points (id BIGINT NOT NULL DEFAULT nextval('bench_points_id_seq'), "
        "series_id BIGINT NOT NULL, ts FLOAT8 NOT NULL, value FLOAT8 NOT NULL, rate FLOAT8, "
        "status VARCHAR(16) NOT NULL, since FLOAT8, step FLOAT8 NOT NULL, PRIMARY KEY (id, ts)) "
        "PARTITION BY RANGE (ts)"
    )
    cur.execute("CREATE INDEX ON bench_points (series_id, ts)")


def _partitioned(cur: Any, width: float, step_index: bool) -> None:
    _partitioned_parent(cur)
    if step_index:
        cur.execute("CREATE INDEX ON bench_points (step, ts)")
    lo = T0 // width * width
    for k in range(-2, 4):  # the batches' times fall in the first; the others are there as in service
        a = lo + k * width
        cur.execute(
            f"CREATE TABLE bench_points_{k + 2} PARTITION OF bench_points FOR VALUES FROM ({a}) TO ({a + width})"
        )
    cur.execute("CREATE TABLE bench_points_default PARTITION OF bench_points DEFAULT")


LAYOUTS: dict[str, Callable[[Any], None]] = {
    "bare (no index)": lambda cur: _flat(cur, indexes=False),
    "one table, service's 3 indexes": lambda cur: _flat(cur, indexes=True),
    "partitioned 6 h, 3 indexes": lambda cur: _partitioned(cur, 6 * 3600.0, step_index=True),
    "partitioned 6 h, 2 indexes": lambda cur: _partitioned(cur, 6 * 3600.0, step_index=False),
}


# --- methods ---------------------------------------------------------------------------------


def by_executemany(cur: Any, rows: list[Row]) -> None:
    cur.executemany(f"INSERT INTO bench_points ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)", rows)


def by_unnest(cur: Any, rows: list[Row]) -> None:
    cur.execute(
        f"INSERT INTO bench_points ({COLUMNS}) SELECT * FROM unnest(%b::bigint[], %b::float8[], %b::float8[], "
        "%b::float8[], %b::text[], %b::float8[], %b::float8[])",
        [list(c) for c in zip(*rows, strict=True)],
    )


def by_copy_binary(cur: Any, rows: list[Row]) -> None:
    with cur.copy(f"COPY bench_points ({COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(TYPES)
        for row in rows:
            copy.write_row(row)


def by_copy_text(cur: Any, rows: list[Row]) -> None:
    with cur.copy(f"COPY bench_points ({COLUMNS}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


METHODS: dict[str, Callable[[Any, list[Row]], None]] = {
    "executemany": by_executemany,
    "unnest(arrays)": by_unnest,
    "COPY binary": by_copy_binary,
    "COPY text": by_copy_text,
}


def measure(layout: str, method: str, batches: list[list[Row]]) -> tuple[float, float, float]:
    """(samples/s wall, client CPU µs per row, server CPU µs per row) for one layout and method,
    on a fresh table. The server's is its backend process's CPU from /proc (WAL writes by the
    walwriter and checkpoints by the checkpointer are not in it)."""
    import psycopg

    with psycopg.connect(PG) as conn:
        with conn.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS bench_points CASCADE")
            cur.execute("DROP SEQUENCE IF EXISTS bench_points_id_seq")
            LAYOUTS[layout](cur)
        conn.commit()
        run = METHODS[method]
        backend = conn.info.backend_pid  # the server process doing this connection's work (same machine)
        server = pid_cpu_seconds(backend)
        wall, cpu = time.perf_counter(), time.process_time()
        for rows in batches:
            with conn.cursor() as cur:
                run(cur, rows)
            conn.commit()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        server = pid_cpu_seconds(backend) - server
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM bench_points")
            stored = cur.fetchone()[0]
            cur.execute("DROP TABLE bench_points CASCADE")
            cur.execute("DROP SEQUENCE IF EXISTS bench_points_id_seq")
        conn.commit()
    n = sum(len(b) for b in batches)
    assert stored == n, (stored, n)
    return n / wall, cpu / n * 1e6, server / n * 1e6


def granularity(partitions: int, width: float, rows: list[list[Row]], reads: int = 20) -> dict[str, float]:
    """Milliseconds of the queries no time bound prunes (the detection stream's read by id, the
    newest id) and of one batch's COPY, with ``partitions`` partitions of ``width`` seconds: 14 days
    of retention is 14 partitions of a day, 56 of 6 h, 336 of an hour."""
    import psycopg

    with psycopg.connect(PG) as conn:
        with conn.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS bench_points CASCADE")
            cur.execute("DROP SEQUENCE IF EXISTS bench_points_id_seq")
            _partitioned_parent(cur)
            top = T0 // width * width + width
            for k in range(partitions):
                a = top - (k + 1) * width
                cur.execute(
                    f"CREATE TABLE bench_points_{k} PARTITION OF bench_points FOR VALUES FROM ({a}) TO ({a + width})"
                )
        conn.commit()
        copy_ms = []
        for batch in rows:
            t = time.perf_counter()
            with conn.cursor() as cur:
                by_copy_binary(cur, batch)
            conn.commit()
            copy_ms.append((time.perf_counter() - t) * 1e3)
        with conn.cursor() as cur:
            cur.execute("ANALYZE bench_points")
            cur.execute("SELECT max(id) FROM bench_points")
            head = cur.fetchone()[0]
        conn.commit()
        read_ms, max_ms = [], []
        for _ in range(reads):
            with conn.cursor() as cur:
                t = time.perf_counter()
                cur.execute(
                    "SELECT id, series_id, ts, value, rate, status, since FROM bench_points WHERE id > %s "
                    "AND step = 0.0 ORDER BY id LIMIT 20000",
                    (head - 5000,),
                )
                cur.fetchall()
                t1 = time.perf_counter()
                cur.execute("SELECT max(id) FROM bench_points")
                cur.fetchone()
                t2 = time.perf_counter()
            read_ms.append((t1 - t) * 1e3)
            max_ms.append((t2 - t1) * 1e3)
        with conn.cursor() as cur:
            cur.execute("DROP TABLE bench_points CASCADE")
            cur.execute("DROP SEQUENCE bench_points_id_seq")
        conn.commit()
    return {
        "copy": statistics.median(copy_ms),
        "read": statistics.median(read_ms),
        "max": statistics.median(max_ms),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=480)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--layouts", default=";".join(LAYOUTS), help="separated by ;")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--granularity", action="store_true", help="compare partition widths instead")
    args = ap.parse_args()
    batches = point_rows(args.rows, args.batch)
    if args.granularity:
        print("| partitions (14 days) | width | COPY of one batch, ms | stream read by id, ms | max(id), ms |")
        print("|---|---|---|---|---|")
        for count, width in ((14, 86400.0), (56, 21600.0), (336, 3600.0)):
            g = granularity(count, width, batches)
            print(f"| {count} | {width / 3600:g} h | {g['copy']:.2f} | {g['read']:.2f} | {g['max']:.2f} |", flush=True)
        return 0
    print("| layout | method | samples/s | client CPU µs/row | server CPU µs/row | runs |")
    print("|---|---|---|---|---|---|")
    for layout in args.layouts.split(";"):
        for method in args.methods.split(","):
            results = [measure(layout, method, batches) for _ in range(args.runs)]
            rate = statistics.median(r[0] for r in results)
            cpu = statistics.median(r[1] for r in results)
            server = statistics.median(r[2] for r in results)
            print(f"| {layout} | {method} | {rate:,.0f} | {cpu:.2f} | {server:.2f} | {args.runs} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
