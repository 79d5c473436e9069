"""``make bench``'s harness at toy sizes (``--smoke``): every section runs against the real parts
(node_exporter, a real central on SQLite and PostgreSQL, the agent, ``fabricd eval``) and reports
well-formed figures. No figure is judged: timing belongs to ``make bench``, not to the tests."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from tests.helpers import need_binary, skip_or_fail
from tests.support.server import pg_reachable


def nats_reachable() -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", 4222), timeout=2):
            return True
    except OSError:
        return False


REPO = Path(__file__).resolve().parent.parent


def test_smoke_run_reports_every_section_and_rewrites_only_the_table(tmp_path: Path) -> None:
    need_binary("prometheus-node-exporter")
    if not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    if not nats_reachable():
        skip_or_fail("NATS at 127.0.0.1:4222 is not reachable")
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nHow to read the table.\n\n<!-- bench:start -->\nan older table\n")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "run.py"),
            "--smoke",
            "--results",
            str(tmp_path / "res"),
            "--docs",
            str(docs),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "res" / "latest.json").read_text())
    assert result["machine"]["mode"] == "smoke" and int(result["machine"]["cores"]) >= 1
    assert result["machine"]["commit"] and result["machine"]["cpu"]
    rows = {(r["section"], r["what"]): r for r in result["rows"]}
    wanted = {
        ("scrape", "ratio fabricd / node_exporter"),
        ("scrape", "ratio fabricd / bare-Python floor"),
        ("footprint", "fabricd agent peak RSS"),
        ("ingest", "ratio central / bare executemany, SQLite"),
        ("ingest", "ratio central / bare executemany, PostgreSQL"),
        ("ingest", "central ingest at steady state, SQLite"),
        ("ingest", "central ingest at steady state, PostgreSQL"),
        ("ingest", "central CPU per sample at steady state, PostgreSQL"),
        ("ingest", "PostgreSQL CPU per sample, first scrapes"),
        ("ingest", "PostgreSQL CPU per sample at steady state"),
        ("ingest", "HTTP floor: uvicorn + FastAPI, a handler storing nothing"),
        ("ingest", "ratio central at steady state / HTTP floor, SQLite"),
        ("exporter", "/metrics render, 10-node fleet"),
        ("exposition", "ratio agent (collect + /metrics) / node_exporter"),
        ("exporter", "central /metrics render (bounded), 20-node fleet"),
        ("transport", "agent -> central samples/s"),
        ("detect", "fabricd eval wall time (clean-ib)"),
        ("detect", "samples/s through the detectors (clean-ib)"),
        ("replica", "CPU per sample, decode, SQLite"),
        ("replica", "CPU per sample, store, PostgreSQL"),
        ("replica", "detection samples/s per core, SQLite"),
        ("replica", "samples/s per core from CPU, PostgreSQL"),
        ("replica", "correlator CPU per sample, partition read-back, PostgreSQL"),
        ("replica", "correlator CPU per sample, detectors, PostgreSQL"),
        ("bus", "NATS JetStream end to end, nats-py"),
        ("bus", "ratio central via NATS / the bus alone"),
        ("bus", "two replicas via NATS, PostgreSQL, per replica"),
    }
    assert wanted <= set(rows), wanted - set(rows)
    for r in result["rows"]:
        assert all(math.isfinite(r[k]) for k in ("median", "min", "max")), r
        assert r["min"] <= r["median"] <= r["max"] and r["runs"] >= 1, r
    # Ratios are taken pair by pair within one run: with one run, exactly the quotient.
    ingest = rows[("ingest", "central ingest, SQLite")]["median"]
    bare = rows[("ingest", "bare executemany, SQLite")]["median"]
    assert math.isclose(rows[("ingest", "ratio central / bare executemany, SQLite")]["median"], ingest / bare)
    floor = rows[("ingest", "HTTP floor: uvicorn + FastAPI, a handler storing nothing")]["median"]
    ratio = rows[("ingest", "ratio central at steady state / HTTP floor, SQLite")]["median"]
    assert math.isclose(ratio, rows[("ingest", "central ingest at steady state, SQLite")]["median"] / floor)
    # PostgreSQL's own processes did the work of the first scrapes (creating every series, storing
    # every point): read from /proc, not zero
    assert rows[("ingest", "PostgreSQL CPU per sample, first scrapes")]["median"] > 0
    # the steady state is timed over the same fleet's next scrapes, after the ingest row's
    steady = rows[("ingest", "central ingest at steady state, SQLite")]
    assert steady["unit"] == "samples/s" and steady["note"].startswith(
        "the same fleet's next 2 scrapes, after the row above"
    )
    agent = rows[("exposition", "fabricd agent per Prometheus scrape (collect + /metrics)")]["median"]
    ne = rows[("exposition", "node_exporter (infiniband only) over HTTP, CPU per scrape")]["median"]
    assert math.isclose(rows[("exposition", "ratio agent (collect + /metrics) / node_exporter")]["median"], agent / ne)
    # The stages add up to the total, and the bus ratio is the quotient of its two rows (one run).
    stages = [rows[("replica", f"CPU per sample, {st}, SQLite")]["median"] for st in ("decode", "store", "detect")]
    assert math.isclose(rows[("replica", "CPU per sample, all three, SQLite")]["median"], sum(stages))
    central = rows[("bus", "central ingest via NATS, PostgreSQL")]["median"]
    alone = rows[("bus", "NATS JetStream end to end, nats-py")]["median"]
    assert math.isclose(rows[("bus", "ratio central via NATS / the bus alone")]["median"], central / alone)
    text = docs.read_text()
    assert text.startswith("# Benchmarks\n\nHow to read the table.\n\n<!-- bench:start -->\nLatest run (smoke): ")
    assert "an older table" not in text and f"commit `{result['machine']['commit']}`" in text
    assert "| scrape | ratio fabricd / node_exporter |" in text and "| section | measurement |" in proc.stdout


def test_an_unknown_section_is_named() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--only", "scrape,ingset"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "unknown section(s) ingset" in proc.stderr


def test_a_run_of_some_sections_replaces_only_their_rows_in_the_docs(tmp_path: Path) -> None:
    """``--only replica`` once rewrote the whole table, dropping every other section's rows: now it
    replaces that section's rows where they were, tags them with its commit, and notes the run. The
    replica section measures bus rows too: those replace the bus rows it measured again, not add a
    second set, and leave the section's other rows alone (``ingest`` measures one ``exporter`` row,
    and dropped the bounded 10,000-node row that ``exposition`` measures)."""
    sys.path.insert(0, str(REPO / "bench"))
    import run as bench_run  # bench/run.py

    docs = tmp_path / "benchmarks.md"
    docs.write_text(
        "# Benchmarks\n\nHow to read.\n\n<!-- bench:start -->\nLatest run (full): then.\n\n"
        "| section | measurement | median | min | max | runs | note |\n|---|---|---|---|---|---|---|\n"
        "| scrape | a | 1 s | 1 s | 1 s | 3 | kept |\n| replica | old | 2 s | 2 s | 2 s | 3 | gone |\n"
        "| bus | b | 3 s | 3 s | 3 s | 3 | replaced too |\n| bus | z | 7 s | 7 s | 7 s | 3 | another's |\n"
        "| ingest | c | 5 s | 5 s | 5 s | 3 | kept too |\n"
    )
    info = {"date": "2026-12-04", "commit": "abc1234", "cpu": "CPU", "cores": "2", "python": "3.11", "mode": "full"}
    new = [
        {
            "section": "replica",
            "what": "new",
            "median": 4.0,
            "min": 4.0,
            "max": 4.0,
            "unit": "s",
            "runs": 3,
            "note": "n",
        },
        {"section": "bus", "what": "b", "median": 6.0, "min": 6.0, "max": 6.0, "unit": "s", "runs": 3, "note": "m"},
        {"section": "bus", "what": "y", "median": 8.0, "min": 8.0, "max": 8.0, "unit": "s", "runs": 3, "note": "o"},
    ]
    bench_run.write_docs(new, info, docs, ["replica"])
    text = docs.read_text()
    assert text.startswith("# Benchmarks\n\nHow to read.\n\n<!-- bench:start -->\nLatest run (full): then.\n")
    assert "The replica rows: `python bench/run.py --only replica` (full) on 2026-12-04, commit `abc1234`" in text
    table = [line.split("|")[1:3] for line in text.splitlines() if line.startswith("| ") and "section" not in line]
    assert [(s.strip(), w.strip()) for s, w in table] == [
        ("scrape", "a"),
        ("replica", "new"),
        ("bus", "b"),
        ("bus", "z"),
        ("ingest", "c"),
        ("bus", "y"),
    ]
    assert "| bus | z | 7 s | 7 s | 7 s | 3 | another's |" in text
    assert "| n (`abc1234`, 2026-12-04) |" in text and "| m (`abc1234`, 2026-12-04) |" in text
    assert "gone" not in text and "replaced too" not in text and "kept too" in text
