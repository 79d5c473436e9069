"""The replicas' parts on the local PostgreSQL: claims and the election (advisory locks on a
session), the correlator's per-partition cursors, and the settings a replica needs.

tests/test_replicas.py runs them together (three processes, one killed -9); here each part alone,
so a failure names the part.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pytest
from pydantic import ValidationError

from fabricd.bus import BusNames
from fabricd.model import Incident, IncidentKind, IncidentState, Sample, Severity
from fabricd.server import db
from fabricd.server.claims import Claims
from fabricd.server.partition_stream import PartitionCursor, PartitionedStream
from fabricd.server.replica_wiring import replica_id
from fabricd.server.store import postgres
from fabricd.server.store.storage import Storage
from fabricd.settings import ServerSettings
from tests.helpers import skip_or_fail
from tests.support.detectors import ImmediateDetector
from tests.support.server import PG_ADMIN_URL, ib_sample, make_batch, pg_reachable, pg_schema

pytestmark = pytest.mark.postgres
T0 = 1_800_000_000.0
CONNINFO = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture
def store() -> Iterator[Storage]:
    if not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    with pg_schema() as url:
        engine = db.make_engine(url)
        db.prepare(engine)
        yield Storage.open(engine)
        engine.dispose()


@pytest.fixture
def prefix() -> str:
    if not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    return f"t{uuid.uuid4().hex[:10]}"


def test_a_partition_has_one_holder_and_is_free_once_its_session_ends(prefix: str) -> None:
    a, b = Claims(CONNINFO, prefix, "a", 4.0), Claims(CONNINFO, prefix, "b", 4.0)
    a.connect()
    b.connect()
    try:
        assert [a.try_claim(p) for p in (0, 1)] == [True, True]
        assert (b.try_claim(0), b.try_claim(2)) == (False, True)
        assert (a.try_lead(), b.try_lead()) == (True, False)
        seen = b.ownership()  # any session reads the same table
        assert (seen.partitions, seen.correlator, seen.replicas) == ({0: "a", 1: "a", 2: "b"}, "a", ["a", "b"])
        a.release(1)
        assert b.try_claim(1)
        a.close()  # what a kill -9 does to the session: the server frees everything it held...
        _eventually(lambda: b.try_claim(0))  # ...once its backend has ended (asynchronously)
        assert b.try_lead()
        seen = _eventually(lambda: (o := b.ownership()).replicas == ["b"] and o)
        assert (seen.partitions, seen.correlator, seen.replicas) == ({0: "b", 1: "b", 2: "b"}, "b", ["b"])
    finally:
        a.close()
        b.close()


def _eventually(check: Callable[[], Any], seconds: float = 10.0) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < deadline, "the ended session's locks were never freed"
        time.sleep(0.05)
    return found


def test_another_deployments_locks_are_not_ours(prefix: str) -> None:
    ours, theirs = Claims(CONNINFO, prefix, "a", 4.0), Claims(CONNINFO, prefix + "x", "z", 4.0)
    ours.connect()
    theirs.connect()
    try:
        assert theirs.try_claim(0) and theirs.try_lead()
        assert ours.try_claim(0) and ours.try_lead()  # another prefix: another lock space
        seen = ours.ownership()
        assert (seen.partitions, seen.correlator, seen.replicas) == ({0: "a"}, "a", ["a"])
    finally:
        ours.close()
        theirs.close()


def _two_partitions(names: BusNames) -> tuple[str, str]:
    nodes = [f"node-{i:03d}" for i in range(1, 50)]
    x = nodes[0]
    y = next(n for n in nodes if names.partition(n) != names.partition(x))
    return x, y


def test_a_point_committed_late_below_another_partitions_points_is_still_read(store: Storage) -> None:
    """Two replicas' transactions commit in any order: one cursor over all point ids would skip a
    point committed after a higher id was read; a cursor per partition (one writer each) does not."""
    names = BusNames("fabricd", 4)
    x, y = _two_partitions(names)
    for node in (x, y):
        store.writer.ingest(make_batch(node, f"{node}-1", [ib_sample(T0)]), T0, 100)
    stream = PartitionedStream(store.latest.db, store.latest.identities, names)
    first, cursor = stream.read(PartitionCursor((0,) * 4))
    single = store.stream.head()  # a single central's cursor, at the same place
    assert sorted(d.node for d in first) == [x, y]
    with store.engine.raw_connection() as raw:  # another replica's transaction for x, open
        cur = raw.cursor()
        cur.execute("SELECT id FROM series WHERE node = %s", (x,))
        (sid,) = cur.fetchone()
        # its batch's chunk, and its node's newest id, as a replica's writer stores them in one
        # transaction (fabricd/server/store/writer.py)
        postgres.CHUNKS.write(cur, x, [(sid, T0 + 10, 1.0, 1.0, "ok", None)])
        cur.execute("UPDATE nodes SET last_point_id = lastval() WHERE name = %s", (x,))
        store.writer.ingest(make_batch(y, f"{y}-2", [ib_sample(T0 + 10)]), T0 + 10, 100)  # commits a higher id
        middle, cursor = stream.read(cursor)
        assert [(d.node, [s.ts for s in d.samples]) for d in middle] == [(y, [T0 + 10])]
        _, single = store.stream.read(single)  # one id cursor: now past y's point, above x's
        raw.commit()
    late, cursor = stream.read(cursor)
    assert [(d.node, [s.ts for s in d.samples]) for d in late] == [(x, [T0 + 10])]
    assert store.stream.read(single)[0] == []  # the single cursor never sees x's point
    stream.save_cursor("detection", cursor)
    assert stream.cursor("detection") == cursor
    assert stream.read(cursor)[0] == []


class _Counting:
    """The store's database, counting the cursors opened on it."""

    def __init__(self, db: Any) -> None:
        self.db, self.opened = db, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        self.opened += 1
        return self.db.cursor(*args, **kwargs)


def test_a_partition_with_nothing_new_is_not_read(store: Storage) -> None:
    """A partition whose nodes fell silent has no point above its cursor: reading it scanned every
    point stored since (to find none), a scan growing with the silence. The nodes' newest point ids,
    committed with the points, bound each partition's read and skip the ones with nothing new."""
    names = BusNames("fabricd", 4)
    x, y = _two_partitions(names)
    for node in (x, y):
        store.writer.ingest(make_batch(node, f"{node}-1", [ib_sample(T0)]), T0, 100)
    db = _Counting(store.latest.db)
    stream = PartitionedStream(db, store.latest.identities, names)  # type: ignore[arg-type]
    first, cursor = stream.read(PartitionCursor((0,) * 4))
    assert sorted(d.node for d in first) == [x, y]
    for k in range(1, 4):  # x falls silent, y goes on
        store.writer.ingest(make_batch(y, f"{y}-{k + 1}", [ib_sample(T0 + 10 * k)]), T0, 100)
    db.opened = 0
    got, after = stream.read(cursor)
    assert [(d.node, [s.ts for s in d.samples]) for d in got] == [(y, [T0 + 10, T0 + 20, T0 + 30])]
    assert db.opened == 3  # the node list before and after, and y's partition: nothing for x's
    assert after.ids[names.partition(x)] == cursor.ids[names.partition(x)]
    db.opened = 0
    assert stream.read(after) == ([], after) and db.opened == 2  # nothing new anywhere: no point read
    # A node stored by an older version (no newest id recorded) is read as before: unbounded.
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE nodes SET last_point_id = NULL WHERE name = %s", (x,))
    db.opened = 0
    assert stream.read(after) == ([], after) and db.opened == 3  # x's partition read again


def test_a_replica_needs_the_bus_and_postgresql() -> None:
    pg = "postgresql+psycopg://fabricd@db/fabricd"
    with pytest.raises(ValidationError, match=r"replica\.enabled: needs bus\.url"):
        ServerSettings(db=pg, replica={"enabled": True})
    with pytest.raises(ValidationError, match=r"replica\.enabled: needs a PostgreSQL db"):
        ServerSettings(bus={"url": "nats://n:4222"}, replica={"enabled": True})
    with pytest.raises(ValidationError, match=r"replica\.partitions: \[16\] outside 0\.\.15"):
        ServerSettings(db=pg, bus={"url": "nats://n:4222"}, replica={"enabled": True, "partitions": [3, 16]})
    ok = ServerSettings(db=pg, bus={"url": "nats://n:4222"}, listen="0.0.0.0:9470", replica={"enabled": True})
    assert replica_id(ok).endswith(":9470")


class HotPort(ImmediateDetector):
    """Congestion on a port whose rate passes 50 (and what it was shown, to see the warm-up)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []

    def process(self, samples: Sequence[tuple[str, Sample]]) -> list[Incident]:
        self.seen += [(node, s.ts) for node, s in samples]
        return [
            Incident(
                f"congestion:{node}",
                IncidentKind.CONGESTION,
                Severity.CRITICAL,
                IncidentState.OPEN,
                node,
                "hot port",
                s.ts,
                s.ts,
            )
            for node, s in samples
            if s.rate is not None and s.rate > 50
        ]


def test_a_new_correlator_rebuilds_its_state_from_the_store_and_opens_nothing_twice(store: Storage) -> None:
    from prometheus_client import CollectorRegistry

    from fabricd.server.detection import DetectionLoop
    from fabricd.server.metrics import ServerMetrics

    names = BusNames("fabricd", 4)
    x, y = _two_partitions(names)
    stream = PartitionedStream(store.latest.db, store.latest.identities, names)
    metrics, heard = ServerMetrics(CollectorRegistry()), []
    listeners = [lambda iid, transition, _inc: heard.append((iid, transition))]
    for node, rate in ((x, 99.0), (y, 1.0)):
        store.writer.ingest(make_batch(node, f"{node}-1", [ib_sample(T0, rate=rate)]), T0, 100)
    first = HotPort()
    loop = DetectionLoop(stream, store.incidents, first, metrics, listeners, lambda: T0 + 2)
    while loop.step():
        pass
    assert [i.element for i in store.incidents.query()] == [x] and [t for _, t in heard] == ["opened"]
    # The correlator dies; more is stored; another takes over with a warm-up over the whole history.
    for node, rate in ((x, 99.0), (y, 1.0)):
        store.writer.ingest(make_batch(node, f"{node}-2", [ib_sample(T0 + 10, rate=rate)]), T0 + 10, 100)
    second = HotPort()
    loop = DetectionLoop(stream, store.incidents, second, metrics, listeners, lambda: T0 + 12, warmup_seconds=3600)
    while loop.step():
        pass
    assert sorted(second.seen) == sorted([(x, T0), (y, T0), (x, T0 + 10), (y, T0 + 10)])  # rebuilt, then on
    assert [t for _, t in heard] == ["opened", "updated"]  # the warm-up wrote nothing, notified nobody
    assert [(i.element, i.state, i.updated_ts) for i in store.incidents.query()] == [(x, "open", T0 + 10)]


def test_a_new_correlator_takes_over_the_open_incidents_and_resolves_the_ones_gone_quiet(store: Storage) -> None:
    # "congestion:leaf-01" is open in the store, last confirmed at T0; the correlator that evaluated up
    # to T0 + 200 s died before it resolved it (here: a detector with no book). The new one's warm-up
    # (the real engine) replays those 200 quiet seconds: its book adopted the incident and resolves it
    # after the quiet period (120 s); the store is told at the warm-up's end. Before, the rebuilt
    # engine did not know the incident, and it stayed open in the store for good.
    from prometheus_client import CollectorRegistry

    from fabricd.detect import DetectionEngine
    from fabricd.model import Candidate, Evidence
    from fabricd.server.detection import DetectionLoop, EngineFeed
    from fabricd.server.metrics import ServerMetrics

    names = BusNames("fabricd", 4)
    x, _ = _two_partitions(names)
    stream = PartitionedStream(store.latest.db, store.latest.identities, names)
    metrics, heard = ServerMetrics(CollectorRegistry()), []
    listeners = [lambda iid, transition, inc: heard.append((transition, inc.key))]
    leaf = Incident(
        "congestion:leaf-01",
        IncidentKind.CONGESTION,
        Severity.WARNING,
        IncidentState.OPEN,
        "leaf-01",
        "leaf-01 (or one of its uplinks) is congested",
        T0 - 30,
        T0,
        candidates=[Candidate("leaf-01~spine-01", 0.5), Candidate("leaf-01~spine-02", 0.5)],
        evidence=[Evidence("ecn_marked_ratio", "node-002", "mlx5_0", "1", 0.1, 0.02, T0, (("priority", "3"),))],
        timeline=[(T0 - 30, "first symptom"), (T0 - 20, "opened: leaf-01 (or one of its uplinks) is congested")],
        ambiguous=True,
    )
    store.incidents.upsert(leaf)
    evidence = store.incidents.query()[0].evidence
    for i in range(21):
        store.writer.ingest(make_batch(x, f"{x}-{i}", [ib_sample(T0 + 10 * i, rate=1.0)]), T0 + 10 * i, 100)
    first = HotPort()  # the dead correlator: evaluated all of it, opened nothing more
    loop = DetectionLoop(stream, store.incidents, first, metrics, (), lambda: T0 + 201)
    while loop.step():
        pass
    feed = EngineFeed(DetectionEngine())
    loop = DetectionLoop(stream, store.incidents, feed, metrics, listeners, lambda: T0 + 202, warmup_seconds=3600)
    while loop.step():
        pass
    assert heard == [("resolved", "congestion:leaf-01")]
    (row,) = store.incidents.query()
    assert (row.key, row.state, row.resolved_ts) == ("congestion:leaf-01", "resolved", T0)
    assert row.timeline[-1][1] == "resolved: quiet since " + _utc(T0)
    assert row.evidence == evidence and [c["element"] for c in row.candidates] == [
        "leaf-01~spine-01",
        "leaf-01~spine-02",
    ]
    assert feed.incidents() == []


def _utc(ts: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(ts))


def test_replicas_starting_together_on_an_empty_database_migrate_it_once() -> None:
    if not pg_reachable():
        skip_or_fail("PostgreSQL at 127.0.0.1:5432 is not reachable")
    with pg_schema() as url:
        engines = [db.make_engine(url) for _ in range(3)]
        try:
            with concurrent.futures.ThreadPoolExecutor(3) as pool:
                revisions = list(pool.map(db.prepare, engines))
            assert revisions == [db.head_revision()] * 3
            assert db.is_ready(engines[0]) == (True, f"schema at revision {db.head_revision()}")
        finally:
            for engine in engines:
                engine.dispose()


def test_an_incident_rederived_by_a_rebuilt_engine_keeps_one_beginning(store: Storage) -> None:
    def version(opened_ts: float, pairs: int, updated_ts: float) -> Incident:
        summary = f"leaf-02~spine-01 is dropping packets, {pairs} node pairs affected"
        return dataclasses.replace(
            Incident(
                "packet_loss:leaf-02~spine-01",
                IncidentKind.PACKET_LOSS,
                Severity.CRITICAL,
                IncidentState.OPEN,
                "leaf-02~spine-01",
                summary,
                T0,
                updated_ts,
            ),
            timeline=[(T0, "first symptom"), (opened_ts, f"opened: {summary}")],
        )

    iid, first = store.incidents.upsert(version(T0 + 20, 7, T0 + 20))
    # The correlator dies; the next one's engine opened the same incident a moment later, by its count.
    again, second = store.incidents.upsert(version(T0 + 25, 8, T0 + 30))
    record = store.incidents.get(iid)
    assert (first, second, again) == ("opened", "updated", iid)
    assert [(e[0], e[1].split(":")[0]) for e in record.timeline] == [(T0, "first symptom"), (T0 + 20, "opened")]
    assert record.updated_ts == T0 + 30


def test_a_replica_that_stops_heartbeating_loses_its_claims_after_a_lease(prefix: str) -> None:
    """A hung replica keeps its socket (its kernel answers keepalives); the server ends its idle
    session after a lease (``idle_session_timeout``), and its next heartbeat says so."""
    hung, other = Claims(CONNINFO, prefix, "hung", 2.0), Claims(CONNINFO, prefix, "other", 2.0)
    hung.connect()
    other.connect()
    try:
        assert hung.try_claim(0) and hung.try_lead()
        assert not other.try_claim(0)
        _eventually(lambda: other.try_claim(0) and other.try_lead(), seconds=30)  # no heartbeat from hung
        with pytest.raises(psycopg.OperationalError):
            hung.heartbeat()
    finally:
        hung.close()
        other.close()


def test_a_replica_reads_one_sources_latest_values_of_other_nodes_from_the_table_alone(store: Storage) -> None:
    """Another replica's nodes come from the series table; asked for one source (the topology's
    LLDP lookup), only that source's rows are read, and no other series' identity is learned."""
    from fabricd.model import Kind, Reading, Status
    from fabricd.server.replica_latest import ReplicaLatest

    def lldp(ts: float, port: str) -> Sample:
        r = Reading("lldp", "eth0", port, "neighbor", 1.0, "", Kind.GAUGE, (("chassis", "leaf-01"),), "neighbor")
        return Sample(ts, r, None, Status.OK)

    other = Storage.open(store.engine)  # the other replica, its own writer and memory
    for node, replica in (("mine", store), ("theirs", other)):
        samples = [lldp(T0, "1"), *(ib_sample(T0, device=f"mlx5_{d}") for d in range(20))]
        replica.writer.ingest(make_batch(node, "b1", samples), T0, 100)
        replica.latest.flush()
    reader = ReplicaLatest(store.latest, owns=lambda node: node == "mine")
    got = [(node, s.reading.source, s.reading.port) for node, s in reader.values(source="lldp")]
    assert got == [("mine", "lldp", "1"), ("theirs", "lldp", "1")]
    theirs = [ident for ident in reader.identities._cache.values() if ident[0] == "theirs"]
    assert [ident[1].source for ident in theirs] == ["lldp"]  # none of their 20 other series
