"""A live run's central database, replayed through the central's detection offline.

``replay_stored`` feeds the stored batches to the service's own detector (``EngineDetector``, the
topology the demo uploaded) in the order and at the times the central received them, ticking once
a second in between as the detection loop does: what the live central saw, without the race of
running it again. ``trim`` cuts a live run's database down to a fixture: the batches received up
to a time, and only the series the detectors read.

``replay_ingested`` stores the same batches again through the writer into a central that follows
it (the stream's in-memory tail, as the live service reads it: ``fabricd.scrape_rows``) and hands
each read to two detectors, one with the deliveries as read and one with their samples as lists.

Regenerate a fixture: ``python -m tests.support.relive DATA_DIR/central/fabricd.db OUT.db END_TS``.
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fabricd.model import Batch, IncidentState
from fabricd.server import db
from fabricd.server.detection import EngineDetector, keep_for
from fabricd.server.store.records import reads
from fabricd.server.store.storage import Storage
from fabricd.settings import ServerSettings

TICK_SECONDS = 1.0  # the detection loop's step when nothing new arrived


@dataclass(frozen=True)
class Opened:
    ts: float  # processing time it opened at
    kind: str
    element: str


@dataclass(frozen=True)
class Resolved:
    ts: float  # processing time it resolved at
    kind: str
    element: str


def replay_stored(path: Path) -> list[Opened]:
    """Every incident opening, in order, of the central's detection over the stored batches."""
    return replay_both(path)[0]


def replay_both(path: Path) -> tuple[list[Opened], list[Resolved]]:
    """Every incident opening and every resolution, in order, of the same replay."""
    seen: set[tuple[str, float]] = set()
    opened: list[Opened] = []
    resolved: list[Resolved] = []
    for changed, now in _replay(path):
        opened += _opened(changed, now, seen)
        resolved += [Resolved(now, i.kind.value, i.element) for i in changed if i.state is IncidentState.RESOLVED]
    return opened, resolved


def _replay(path: Path) -> Iterator[tuple[list, float]]:  # type: ignore[type-arg]
    """The incidents each delivery changed, with the processing time it was delivered at."""
    with sqlite3.connect(path) as con:
        batches = con.execute("SELECT node, received_ts, samples FROM ingested_batches ORDER BY id").fetchall()
    engine = db.make_engine(f"sqlite:///{path}")
    db.prepare(engine)
    try:
        store = Storage.open(engine)
        det = EngineDetector(ServerSettings(), store.topology)
        det.expect(sorted({b[0] for b in batches}), batches[0][1])
        keep = keep_for(det)
        cursor, tick = 0, batches[0][1]
        for _, received, count in batches:
            while tick + TICK_SECONDS < received:
                tick += TICK_SECONDS
                yield det.deliver([], tick, frozenset()), tick
            deliveries, cursor = store.stream.read(cursor, count, keep=keep)
            yield det.deliver(deliveries, received, frozenset()), received
    finally:
        engine.dispose()


def replay_ingested(path: Path, into: Path) -> Iterator[tuple[float, list, list, list]]:  # type: ignore[type-arg]
    """The stored batches of ``path`` stored again in a new central database at ``into`` (the same
    topology) that reads them back from its tail: at each delivery, its processing time, the
    deliveries, and the incidents changed by a detector given them as read and by one given their
    samples as lists (the same samples, built)."""
    with sqlite3.connect(path) as con:
        rows = con.execute("SELECT node, batch_id, received_ts, samples FROM ingested_batches ORDER BY id").fetchall()
    source = db.make_engine(f"sqlite:///{path}")
    target = db.make_engine(f"sqlite:///{into}")
    db.prepare(source)
    db.prepare(target)
    try:
        old = Storage.open(source)
        store = Storage.open(target, stream_tail_points=1_000_000)
        store.topology.put(old.topology.get().doc, rows[0][2])
        rows_detector, lists_detector = (EngineDetector(ServerSettings(), store.topology) for _ in range(2))
        for det in (rows_detector, lists_detector):
            det.expect(sorted({r[0] for r in rows}), rows[0][2])
        keep = keep_for(rows_detector)
        old_cursor = cursor = 0
        for seq, (node, batch_id, received, count) in enumerate(rows, start=1):
            stored, old_cursor = old.stream.read(old_cursor, count)
            batch = Batch(node, "relive", batch_id, [s for d in stored for s in d.samples], instance="relive", seq=seq)
            store.writer.ingest(batch, received, 100_000)
            deliveries, cursor = store.stream.read(cursor, count, keep=keep)
            as_lists = [d._replace(samples=list(d.samples)) for d in deliveries]
            yield (
                received,
                deliveries,
                rows_detector.deliver(deliveries, received, frozenset()),
                lists_detector.deliver(as_lists, received, frozenset()),
            )
    finally:
        source.dispose()
        target.dispose()


def _opened(changed: list, now: float, seen: set[tuple[str, float]]) -> list[Opened]:  # type: ignore[type-arg]
    """The incidents of ``changed`` that opened (or reopened) since ``seen``: their "opened" entry
    need not be the last, as an escalation can follow it in the same evaluation."""
    out = []
    for inc in changed:
        for ts, what, *_ in inc.timeline:
            if (
                inc.state is IncidentState.OPEN
                and what.startswith(("opened", "reopened"))
                and (inc.key, ts) not in seen
            ):
                seen.add((inc.key, ts))
                out.append(Opened(now, inc.kind.value, inc.element))
    return out


def trim(src: Path, dst: Path, end_ts: float) -> None:
    """Copy ``src`` to ``dst`` keeping the batches received up to ``end_ts`` and, of their points,
    those of the series the detectors read, renumbered so each batch is its next ``samples`` points."""
    shutil.copy(src, dst)
    with sqlite3.connect(dst) as con:  # it renumbers rows of ``points``: raw points before migration 0008
        if con.execute("SELECT 1 FROM sqlite_master WHERE name = 'point_chunks'").fetchone():
            raise SystemExit(f"{src}: trim a capture taken before schema 0008 (raw points as rows)")
    engine = db.make_engine(f"sqlite:///{dst}")
    try:
        store = Storage.open(engine)
        inputs = EngineDetector(ServerSettings(), store.topology).inputs()
        with sqlite3.connect(dst) as con:
            sids = [r[0] for r in con.execute("SELECT id FROM series")]
            idents = {}
            for k in range(0, len(sids), 1000):
                idents.update(store.stream.identities.of(set(sids[k : k + 1000])))
            kept = [(sid,) for sid, (_, reading) in idents.items() if inputs is None or reads(inputs, reading)]
            _cut(con, kept, end_ts)
        with sqlite3.connect(dst) as con:
            con.execute("VACUUM")
    finally:
        engine.dispose()


def _cut(con: sqlite3.Connection, kept: list[tuple[int]], end_ts: float) -> None:
    rows = con.execute("SELECT id, samples, received_ts FROM ingested_batches ORDER BY id").fetchall()
    ranges, upto = [], 0
    for bid, n, received in rows:  # one writer: a batch's points are consecutive ids
        if received <= end_ts:
            ranges.append((bid, upto, upto + n))
        upto += n
    con.execute("CREATE TEMP TABLE keep (id INTEGER PRIMARY KEY)")
    con.executemany("INSERT INTO keep VALUES (?)", kept)
    con.execute("DELETE FROM points WHERE id > ? OR series_id NOT IN (SELECT id FROM keep)", (ranges[-1][2],))
    con.execute("DELETE FROM ingested_batches WHERE id > ?", (ranges[-1][0],))
    for bid, lo, hi in ranges:
        n = con.execute("SELECT count(*) FROM points WHERE id > ? AND id <= ?", (lo, hi)).fetchone()[0]
        con.execute("UPDATE ingested_batches SET samples = ? WHERE id = ?", (n, bid))
    con.execute("DELETE FROM incidents")
    con.execute("DELETE FROM cursors")
    cols = "series_id, ts, value, rate, status, since, step"
    con.execute("CREATE TEMP TABLE kept_points AS SELECT * FROM points ORDER BY id")
    con.execute("DELETE FROM points")
    con.execute(f"INSERT INTO points ({cols}) SELECT {cols} FROM kept_points ORDER BY id")


if __name__ == "__main__":
    trim(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]))
