"""One replica's CPU per sample, stage by stage: decode, store, detect (in-process, one thread).

The service's own functions on the bench's fleet: ``ingest.decode`` (gunzip, msgpack, the typed
rows, the limits), ``GroupCommitWriter.ingest`` (one transaction per batch), and the detection
loop's work (``Stream.read`` from the tail, keeping only the detectors' inputs, then the service's
detector stack: job attribution, rank stragglers, settlement and ``DetectionEngine`` through
``EngineDetector``, as ``fabricd.server.app`` builds it), each timed with ``time.thread_time`` (this thread's CPU: the other helpers' load
on the machine moves it far less than wall time). The samples carry real counter names (the IBA
PortCounters and mlx5 hw_counters tables) so the detection rules do their real work. The sum is
what one core pays per sample; 1e6 / sum is the samples/s one replica's core could do, HTTP and
the bus left out (the ``ingest`` rows measure the whole service).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

STAGES = ("decode", "store", "detect")
# Counters that move on a healthy fabric; every other one (errors, congestion marks) stays at 0.
TRAFFIC = frozenset(
    f"{kind}_{way}_{what}"
    for kind in ("port", "unicast", "multicast")
    for way in ("xmit", "rcv")
    for what in ("data", "packets")
)
READ_POINTS = 20_000  # the detection loop's read (fabricd/server/detection.py)
# The first scrapes of a node teach detection its series, records and devices (about 8 µs a sample,
# docs/storage.md): a one-time cost. Steady state is every scrape after these.
LEARNING_SCRAPES = 2


def counter_names() -> list[tuple[str, str]]:
    """Every (counter, neutral name) pair of the real InfiniBand tables a ConnectX port reports,
    each once: the IBA PortCounters, then the mlx5 hw_counters (57). An agent sends each series of a
    scrape once; padding these to 60 by repeating three made every batch hold 24 duplicate
    identities, which took the writer's general path instead of a first scrape's."""
    from fabricd.drivers.ib import mlx5, pma

    table = [*pma.BASE, *pma.DATA, *pma.EXT_ONLY, *pma.EXTRA, *mlx5.DRIVER.counters]
    seen: dict[str, str] = {}
    for c in table:
        seen.setdefault(c.raw, c.name or c.raw)
    return list(seen.items())


def fleet(nodes: int, scrapes: int, ports: int, t0: float) -> list[Any]:
    """Batches as the agents send them (one per node and scrape), real counter names: traffic
    counters at a steady rate, error counters at 0 (a healthy fabric: nothing to localize)."""
    from fabricd.model import Batch, Kind, Reading, Sample

    names = counter_names()
    out = []
    for k in range(scrapes):
        ts = t0 + 10.0 * k
        for n in range(nodes):
            samples = [
                Sample(
                    ts,
                    Reading(
                        "infiniband", f"mlx5_{p}", "1", raw, float(k * 1000 + c), "packets", Kind.COUNTER, (), name
                    ),
                    rate=1e6 + c if raw in TRAFFIC else 0.0,
                )
                for p in range(ports)
                for c, (raw, name) in enumerate(names)
            ]
            out.append(
                Batch(f"node-{n:04d}", "bench", f"b-{n}-{k}", samples, created_ts=ts, instance=f"i{n}", seq=k + 1)
            )
    return out


def measure(url: str, batches: list[Any], bodies: list[bytes]) -> dict[str, float]:
    """CPU µs per sample of each stage, one run on a fresh database at ``url``; ``detect_steady``
    is the detect stage over the scrapes after the first ``LEARNING_SCRAPES`` of every node."""
    from fabricd import gctune
    from fabricd.server import db
    from fabricd.server.ingest import Body, decode
    from fabricd.server.store.storage import Storage
    from fabricd.settings import LimitSettings

    engine = db.make_engine(url)
    db.prepare(engine)
    store = Storage.open(engine, stream_tail_points=100_000)
    store.maintenance.prepare(time.time())
    feed, keep = detectors(store, batches)
    limits = LimitSettings()
    spent = dict.fromkeys(STAGES, 0.0)
    cursor = samples = pending = steady_samples = 0
    steady_seconds = 0.0
    learned = LEARNING_SCRAPES * len({b.node for b in batches})  # batches before the steady state
    clock = time.thread_time
    gctune.tune_for_service()  # as the central's main() does
    for i, body in enumerate(bodies):
        t = clock()
        batch = decode(Body(body, "application/msgpack", True), limits)
        t1 = clock()
        store.writer.ingest(batch, time.time(), limits.max_series_per_node)
        t2 = clock()
        spent["decode"] += t1 - t
        spent["store"] += t2 - t1
        samples += len(batch.samples)
        pending += len(batch.samples)
        # The detection loop reads up to 20,000 points a step: at these rates it never waits.
        # Read also when the learning scrapes end, so that no read mixes them with steady ones.
        if pending >= READ_POINTS or i == len(bodies) - 1 or i == learned - 1:
            t, read = clock(), pending
            while pending > 0:
                deliveries, cursor = store.stream.read(cursor, READ_POINTS, keep=keep)
                feed.deliver(deliveries, time.time(), frozenset())
                pending -= sum(d.read for d in deliveries)
            spent["detect"] += clock() - t
            if i >= learned:
                steady_seconds += clock() - t
                steady_samples += read
    out = {stage: seconds / samples * 1e6 for stage, seconds in spent.items()}
    out["detect_steady"] = steady_seconds / steady_samples * 1e6 if steady_samples else float("nan")
    if engine.dialect.name == "postgresql":
        out.update(correlator(store, batches, samples))
    engine.dispose()
    return out


def detectors(store: Any, batches: list[Any]) -> tuple[Any, Any]:
    """The service's detector stack as ``fabricd.server.app`` builds it (job attribution, rank
    stragglers, settlement and the engine), expecting the fleet's nodes, and what it reads."""
    from fabricd.server.detection import EngineDetector, keep_for
    from fabricd.server.jobattribution import JobAttribution
    from fabricd.server.rankstragglers import RankStragglerDetector
    from fabricd.settings import ServerSettings

    feed = JobAttribution(
        RankStragglerDetector(EngineDetector(ServerSettings(), store.topology)), store.jobs, store.topology
    )
    feed.expect({b.node for b in batches}, time.time())
    return feed, keep_for(feed)  # as the detection loop reads: only what the detectors use


def correlator(store: Any, batches: list[Any], samples: int) -> dict[str, float]:
    """The correlator of replicas over the same stored fleet: every bus partition (the default
    count) read back from PostgreSQL past its cursor (``PartitionedStream``, READ_POINTS a
    partition a read) and handed to a fresh detector stack; thread CPU µs a sample of the read and
    of the detectors (a single central reads its in-memory tail instead: the detect stage)."""
    from fabricd.bus import BusNames
    from fabricd.server.partition_stream import PartitionCursor, PartitionedStream

    names = BusNames()
    stream = PartitionedStream(store.latest.db, store.latest.identities, names)
    feed, keep = detectors(store, batches)
    cursor = PartitionCursor((0,) * names.partitions)
    clock, read, detect, got = time.thread_time, 0.0, 0.0, 0
    while got < samples:
        t = clock()
        deliveries, cursor = stream.read(cursor, READ_POINTS, keep=keep)
        t1 = clock()
        feed.deliver(deliveries, time.time(), frozenset())
        read, detect = read + t1 - t, detect + clock() - t1
        n = sum(d.read for d in deliveries)
        if n == 0:
            raise RuntimeError(f"the partitions gave {got} of the {samples} samples stored")
        got += n
    return {"correlator_read": read / got * 1e6, "correlator_detect": detect / got * 1e6}


def run_on(url_of: Any, nodes: int, scrapes: int, runs: int, tmp: Path) -> list[dict[str, float]]:
    """``runs`` measurements after a warm-up, each on a database from ``url_of(run, tmp)``."""
    from fabricd.wire import encode

    batches = fleet(nodes, scrapes, 8, t0=time.time() - 10.0 * scrapes)
    bodies = [encode(b) for b in batches]
    results = []
    for run in range(runs + 1):
        url, cleanup = url_of(run, tmp)
        try:
            results.append(measure(url, batches, bodies))
        finally:
            cleanup()
    return results[1:]
