"""The latest values' durable copy (fabricd/server/store/latest.py, migration 0009): a packed row per
node. An existing database's ``series.latest_*`` move into it and back; a value a release before
0009 writes to the columns (a replica in a rolling upgrade) is read beside the packed rows, the
newer winning; and two replicas flushing one node (a takeover) never put an older value back."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, text

from fabricd.server import db
from fabricd.server.replica_latest import ReplicaLatest
from fabricd.server.store import chunks
from fabricd.server.store import latest as latest_module
from fabricd.server.store.inventory import Inventory
from fabricd.server.store.latest_memory import LatestMemory
from fabricd.server.store.storage import Storage
from fabricd.wire import decode, encode
from tests.helpers import skip_or_fail
from tests.support.points import written_latest
from tests.support.server import backend_url, ib_sample, make_batch, pg_reachable

T0 = 1_800_000_000.0
SERIES = (
    "INSERT INTO series (id, node, source, device, port, counter, labels, name, unit, kind, latest_ts, "
    "latest_value, latest_rate, latest_status, latest_since) VALUES "
    "(1, 'n1', 'infiniband', 'mlx5_0', '1', 'port_xmit_data', '{}', 'port_transmit_data', 'bytes', 'counter', "
    f"{T0}, 10.0, 2.5, 'ok', NULL), "
    "(2, 'n1', 'infiniband', 'mlx5_1', '1', 'port_xmit_data', '{}', 'port_transmit_data', 'bytes', 'counter', "
    f"{T0 + 5}, 11.0, NULL, NULL, {T0 - 60}), "
    "(3, 'n2', 'infiniband', 'mlx5_0', '1', 'port_xmit_data', '{}', 'port_transmit_data', 'bytes', 'counter', "
    f"{T0}, 12.0, 0.0, 'wrapped', NULL), "
    "(4, 'n2', 'infiniband', 'mlx5_1', '1', 'port_xmit_data', '{}', 'port_transmit_data', 'bytes', 'counter', "
    "NULL, NULL, NULL, NULL, NULL)"
)
LEGACY = "SELECT id, latest_ts, latest_value, latest_rate, latest_status, latest_since FROM series ORDER BY id"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "postgres" and not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    with backend_url(request.param, tmp_path) as url:
        e = db.make_engine(url)
        db.ensure_data_dir(e)
        yield e
        e.dispose()


def _migrate(engine: Engine, to: str, down: bool = False) -> None:
    with engine.begin() as conn:
        cfg = db.alembic_config()
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, to)


def test_the_migration_moves_the_series_latest_values_into_packed_rows_and_back(engine: Engine) -> None:
    _migrate(engine, "0008")
    with engine.begin() as conn:
        conn.execute(text(SERIES))
        before = [tuple(r) for r in conn.execute(text(LEGACY))]
    assert db.prepare(engine) == db.head_revision()
    with engine.connect() as conn:
        written = written_latest(conn)
        nodes = conn.execute(text("SELECT node, count FROM latest_chunks ORDER BY node")).all()
        cleared = {tuple(r)[1:] for r in conn.execute(text(LEGACY))}
    # A NULL status read as "ok" before, and is "ok" now; series 4 never had a value.
    assert written == {
        1: (1, T0, 10.0, 2.5, "ok", None),
        2: (2, T0 + 5, 11.0, None, "ok", T0 - 60),
        3: (3, T0, 12.0, 0.0, "wrapped", None),
    }
    assert [tuple(n) for n in nodes] == [("n1", 2), ("n2", 1)] and cleared == {(None,) * 5}
    store = Storage.open(engine)  # what the service serves after the upgrade
    assert [(n, s.reading.device, s.ts, s.reading.value) for n, s in store.latest.values()] == [
        ("n1", "mlx5_0", T0, 10.0),
        ("n1", "mlx5_1", T0 + 5, 11.0),
        ("n2", "mlx5_0", T0, 12.0),
    ]
    _migrate(engine, "0008", down=True)
    with engine.connect() as conn:
        after = [tuple(r) for r in conn.execute(text(LEGACY))]
    assert after == [
        (1, T0, 10.0, 2.5, "ok", None),
        (2, T0 + 5, 11.0, None, "ok", T0 - 60),
        (3, T0, 12.0, 0.0, "wrapped", None),
        (4, None, None, None, None, None),
    ]
    assert before[1] == (2, T0 + 5, 11.0, None, None, T0 - 60)  # the NULL status comes back as "ok"


def test_a_value_an_older_release_wrote_to_the_series_row_is_read_when_it_is_newer(engine: Engine) -> None:
    """A rolling upgrade: a replica still on the release before 0009 writes ``series.latest_*``.
    A restarted service and another replica's REST read take the newer of that and the packed row."""
    db.prepare(engine)
    store = Storage.open(engine)
    store.writer.ingest(
        make_batch("n1", "a", [ib_sample(T0, rate=1.0), ib_sample(T0, device="mlx5_1", rate=2.0)]), T0, 100
    )
    assert store.latest.flush() == 2
    with engine.begin() as conn:  # the old release stored n1's next scrape of mlx5_0 and wrote its row
        conn.execute(
            text("UPDATE series SET latest_ts = :ts, latest_value = 9.0, latest_rate = 3.0 WHERE device = 'mlx5_0'"),
            {"ts": T0 + 10},
        )
    restarted = Storage.open(engine)
    assert [(s.reading.device, s.ts, s.rate) for _n, s in restarted.latest.values()] == [
        ("mlx5_0", T0 + 10, 3.0),
        ("mlx5_1", T0, 2.0),
    ]
    other = ReplicaLatest(Storage.open(engine).latest, owns=lambda _node: False)
    assert [(s.reading.device, s.ts, s.rate) for _n, s in other.values(node="n1")] == [
        ("mlx5_0", T0 + 10, 3.0),
        ("mlx5_1", T0, 2.0),
    ]
    found = Inventory(other.db, other)  # a REST read of a series on a replica that does not own its node
    assert [(s.reading.device, s.latest.rate if s.latest else None) for s in found.find_series()] == [
        ("mlx5_0", 3.0),
        ("mlx5_1", 2.0),
    ]


@pytest.mark.postgres
def test_a_replica_with_an_older_view_of_a_node_never_writes_it_back(tmp_path: Path) -> None:
    """A takeover: the new owner's memory holds what it loaded when it started, older than what the
    old owner flushed since. Its flush keeps the newer stored value of each series, and learns it."""
    if not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    with backend_url("postgres", tmp_path) as url:
        engine = db.make_engine(url)
        try:
            db.prepare(engine)
            old_owner, new_owner = Storage.open(engine), Storage.open(engine)
            new_owner.latest.load()  # started before the old owner's points
            samples = [ib_sample(T0 + 10, rate=1.0), ib_sample(T0 + 10, device="mlx5_1", rate=2.0)]
            old_owner.writer.ingest(make_batch("n1", "a", samples), T0, 100)
            assert old_owner.latest.flush() == 2
            # The old owner dies; the new one stores n1's next batch, with only mlx5_1 in it.
            new_owner.writer.ingest(make_batch("n1", "b", [ib_sample(T0 + 20, device="mlx5_1", rate=4.0)]), T0, 100)
            assert new_owner.latest.flush() == 1
            with engine.connect() as conn:
                devices = dict(conn.execute(text("SELECT id, device FROM series")).all())
                written = {devices[sid]: (row[1], row[3]) for sid, row in written_latest(conn).items()}
            mine = [(s.reading.device, s.ts, s.rate) for _n, s in new_owner.latest.values()]
        finally:
            engine.dispose()
    assert written == {"mlx5_0": (T0 + 10, 1.0), "mlx5_1": (T0 + 20, 4.0)}
    assert mine == [("mlx5_0", T0 + 10, 1.0), ("mlx5_1", T0 + 20, 4.0)]


def test_sqlite_packs_before_the_write_lock_and_flushes_run_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite a flush packs its group before it takes the write lock: a batch is stored while it
    packs. A second flush waits for the first, so the older snapshot, packed first, never lands
    over the newer one: the table ends with the batch stored meanwhile."""
    with backend_url("sqlite", tmp_path) as url:
        engine = db.make_engine(url)
        db.ensure_data_dir(engine)
        try:
            db.prepare(engine)
            store = Storage.open(engine)
            store.writer.ingest(make_batch("n1", "a", [ib_sample(T0, rate=1.0)]), T0, 100)
            packing, go_on, real = threading.Event(), threading.Event(), latest_module._packed

            def held(mine: dict[str, dict[int, tuple[object, ...]]]) -> list[tuple[str, int, bytes]]:
                packing.set()
                assert go_on.wait(30)
                return real(mine)  # type: ignore[arg-type]

            monkeypatch.setattr(latest_module, "_packed", held)
            first = threading.Thread(target=store.latest.flush)
            first.start()
            assert packing.wait(30)
            # ingest is not locked out while the first flush packs its (older) snapshot
            store.writer.ingest(make_batch("n1", "b", [ib_sample(T0 + 10, rate=2.0)]), T0 + 10, 100)
            packing.clear()
            second = threading.Thread(target=store.latest.flush)
            second.start()
            second.join(0.5)
            waited = second.is_alive() and not packing.is_set()  # not even packing yet
            go_on.set()
            first.join(30)
            second.join(30)
            with engine.connect() as conn:
                written = [(row[1], row[3]) for row in written_latest(conn).values()]
        finally:
            engine.dispose()
    assert waited and not first.is_alive() and not second.is_alive()
    assert written == [(T0 + 10, 2.0)]


def test_memory_keeps_the_newest_point_whether_a_batch_is_one_scrape_or_a_backlog() -> None:
    """``LatestMemory.apply`` takes one scrape at or after a node's newest value whole (its fast
    path); anything else row by row. Either way a series keeps its newest point, the later one on
    a tie, and only series whose value changed are left to flush."""
    mem = LatestMemory()

    def row(sid: int, ts: float, value: float) -> tuple[int, float, float, None, str, None]:
        return (sid, ts, value, None, "ok", None)

    def held(node: str) -> dict[int, tuple[float, float]]:
        return {r[0]: (r[1], r[2]) for r in mem.rows(node, None)}

    mem.apply("n1", [row(1, T0, 1.0), row(2, T0, 2.0), row(1, T0, 3.0)])  # one scrape: the later wins a tie
    assert held("n1") == {1: (T0, 3.0), 2: (T0, 2.0)} and mem.pending() == 2
    mem.take_dirty()
    mem.written()
    mem.apply("n1", [row(1, T0 - 10, 9.0), row(3, T0 - 10, 9.0)])  # an older scrape (a spooled one)
    assert held("n1") == {1: (T0, 3.0), 2: (T0, 2.0), 3: (T0 - 10, 9.0)} and mem.pending() == 1
    mem.apply("n1", [row(2, T0 + 20, 5.0), row(2, T0 + 10, 4.0)])  # a backlog, out of order
    assert held("n1")[2] == (T0 + 20, 5.0)
    mem.apply("n1", [row(1, T0 + 20, 6.0)])  # a tie with the node's newest: taken whole
    mem.apply("n1", [row(3, T0 + 15, 7.0)])  # older than the node's newest, newer than its own
    assert held("n1") == {1: (T0 + 20, 6.0), 2: (T0 + 20, 5.0), 3: (T0 + 15, 7.0)}
    mem.apply("n1", [row(1, T0 + 30, 8.0), row(2, T0 + 30, 9.0)], ts=T0 + 30, sids=(1, 2))  # as the writer says
    mem.apply("n1", [row(3, T0 + 25, 1.0)], ts=T0 + 25, sids=(3,))  # one scrape behind the newest
    assert held("n1") == {1: (T0 + 30, 8.0), 2: (T0 + 30, 9.0), 3: (T0 + 25, 1.0)}
    mem.apply("n1", [row(3, T0 + 20, 0.0)], ts=T0 + 20, sids=(3,))  # older than its own: kept out
    assert held("n1")[3] == (T0 + 25, 1.0)
    mem.apply("n2", [row(4, T0 - 100, 1.0)])  # another node's own newest
    assert held("n2") == {4: (T0 - 100, 1.0)} and mem.pending() == 4
    mem.apply("n2", [])
    assert mem.pending() == 4


def test_the_flush_writes_a_nodes_stored_chunk_while_memory_holds_exactly_that_batch() -> None:
    """``LatestMemory.packed`` hands the flush the writer's chunk of a node's last batch when the
    node's values are that batch's rows, each once, and packs the node's rows otherwise: after a
    batch of part of its series, a series twice, a backlog taken row by row, or once the chunk
    was handed out. Either way the packed rows are the node's values."""
    mem, packs = LatestMemory(), []

    def pack(mine: dict[str, dict[int, tuple]]) -> list[tuple[str, int, bytes]]:
        packs.append(sorted(mine))
        return latest_module._packed(mine)  # type: ignore[arg-type]

    def row(sid: int, ts: float, value: float) -> tuple[int, float, float, None, str, None]:
        return (sid, ts, value, None, "ok", None)

    def scrape(node: str, ts: float, rows: list[tuple]) -> bytes:
        blob = chunks.pack(rows)[0]
        mem.apply(node, rows, ts=ts, sids=tuple(r[0] for r in rows), packed=blob)
        return blob

    def values(got: list[tuple[str, int, bytes]]) -> dict[str, dict[int, float]]:
        return {node: {r[0]: r[2] for r in chunks.rows(blob, count)} for node, count, blob in got}

    first = scrape("n1", T0, [row(1, T0, 1.0), row(2, T0, 2.0)])
    other = scrape("n2", T0, [row(3, T0, 3.0)])
    got = mem.packed(["n2", "n1"], pack)
    assert [(node, count) for node, count, _ in got] == [("n2", 1), ("n1", 2)] and packs == []
    assert got[0][2] is other and got[1][2] is first  # the writer's own chunks
    assert values(mem.packed(["n1"], pack)) == {"n1": {1: 1.0, 2: 2.0}} and packs == [["n1"]]  # handed out once
    scrape("n1", T0 + 10, [row(1, T0 + 10, 5.0)])  # part of the node's series
    assert values(mem.packed(["n1"], pack)) == {"n1": {1: 5.0, 2: 2.0}} and packs[-1] == ["n1"]
    scrape("n1", T0 + 20, [row(1, T0 + 20, 6.0), row(1, T0 + 20, 7.0)])  # a series twice, and part
    assert values(mem.packed(["n1"], pack)) == {"n1": {1: 7.0, 2: 2.0}} and len(packs) == 3
    whole = scrape("n1", T0 + 30, [row(2, T0 + 30, 8.0), row(1, T0 + 30, 9.0)])  # every series again
    mem.apply("n1", [row(2, T0 + 40, 1.0), row(1, T0 + 25, 0.0)])  # then a backlog, row by row
    got = mem.packed(["n1"], pack)
    assert got[0][2] is not whole and values(got) == {"n1": {1: 9.0, 2: 1.0}} and len(packs) == 4


def test_the_stored_chunk_is_kept_for_sqlites_flush_alone_and_the_flush_writes_it(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the writer: on SQLite a node's flush writes its last stored chunk when the batch
    held all its series (nothing packed again) and packs its values after a batch of part of
    them; PostgreSQL's flush merges each node with its stored row and packs it, so its memory
    keeps no chunk. The table holds the node's values either way."""
    db.prepare(engine)
    store = Storage.open(engine)
    store.latest.load()  # as the service does at start-up (``app.py``), before any batch
    sqlite = engine.dialect.name == "sqlite"
    packs: list[list[str]] = []
    real = latest_module._packed

    def pack(mine: dict[str, dict[int, tuple]]) -> list[tuple[str, int, bytes]]:
        packs.append(sorted(mine))
        return real(mine)  # type: ignore[arg-type]

    monkeypatch.setattr(latest_module, "_packed", pack)

    def scrape(batch_id: str, ts: float, rates: dict[str, float], seq: int) -> dict[int, float]:
        samples = [ib_sample(ts, device=d, rate=r) for d, r in rates.items()]
        store.writer.ingest(
            decode(encode(make_batch("n1", batch_id, samples, seq=seq)), gzipped=True, columnar=True), ts, 10
        )
        store.latest.flush()
        with engine.connect() as conn:
            return {sid: row[3] for sid, row in written_latest(conn).items()}

    assert scrape("a", T0, {"mlx5_0": 1.0, "mlx5_1": 2.0}, 1) == {1: 1.0, 2: 2.0}
    assert packs == ([] if sqlite else [["n1"]])
    assert scrape("b", T0 + 10, {"mlx5_0": 3.0}, 2) == {1: 3.0, 2: 2.0}  # part of its series
    assert packs[-1] == ["n1"]
    store.writer.ingest(
        decode(
            encode(make_batch("n1", "c", [ib_sample(T0 + 20, device=d) for d in ("mlx5_0", "mlx5_1")], seq=3)),
            gzipped=True,
            columnar=True,
        ),
        T0 + 20,
        10,
    )
    before = len(packs)
    store.latest._mem.packed(["n1"], pack)  # what memory holds for the flush
    assert len(packs) == before + (0 if sqlite else 1)
