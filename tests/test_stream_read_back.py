"""Points read back from the database go to the detectors through each node's plan (``read_back``),
and what they get is exactly what the point-by-point path (``deliveries``) gives them.

The correlator of replicas reads its partitions from PostgreSQL, and a single central behind its
in-memory tail reads the database: both hand ``read_back``'s deliveries to the detectors. Rows of
every shape a read meets are compared here with ``deliveries`` on the same rows: nodes scraping
at the same event time, a node's two scrapes back to back, a batch spanning two scrapes, batches
cut by a read's limit at either end, a series that does not exist, and reads that reuse the plans
learned by the reads before them.
"""

from __future__ import annotations

import random
from typing import Any

from fabricd.detect.engine import DetectionEngine
from fabricd.model import Kind, Reading
from fabricd.scrape_rows import ScrapeRows
from fabricd.server.store.plans import Chunk, deliveries, planned, read_back
from fabricd.server.store.records import Delivery, Keep, PointRow

T0 = 1_800_000_000.0
# (counter, neutral name, kind): two the engine reads as rates, a gauge it reads, one it never reads
SERIES = [
    ("port_xmit_data", "port_transmit_data", Kind.COUNTER),
    ("port_rcv_data", "port_receive_data", Kind.COUNTER),
    ("state", "port_state", Kind.GAUGE),
    ("VL15_dropped", "vl15_dropped", Kind.COUNTER),
]
NODES = [f"n{i}" for i in range(4)]
DEVICES = ("mlx5_0", "mlx5_1")


def identities() -> dict[int, tuple[str, Reading]]:
    """Series ids -> (node, identity reading), as ``Identities`` holds them: each node's series
    in the order its agent sends them."""
    out: dict[int, tuple[str, Reading]] = {}
    sid = 1
    for node in NODES:
        for device in DEVICES:
            for counter, name, kind in SERIES:
                out[sid] = (node, Reading("infiniband", device, "1", counter, 0.0, "packets", kind, (), name))
                sid += 1
    return out


IDENTS = identities()


def batch(node: str, ts: float, rng: random.Random) -> list[PointRow]:
    """One scrape of ``node``: every series of it, in order, values and rates moving."""
    rows: list[PointRow] = []
    for sid, (owner, _reading) in IDENTS.items():
        if owner == node:
            rate = None if rng.random() < 0.1 else rng.uniform(0, 1e9)  # no honest rate, sometimes
            rows.append((sid, ts, rng.uniform(0, 1e12), rate, "ok" if rate is not None else "first", None))
    return rows


def stored(rng: random.Random) -> list[PointRow]:
    """Rows in id order as a database holds them after some scrapes of the fleet."""
    rows: list[PointRow] = []
    for k in range(6):
        same = rng.random() < 0.5  # nodes scraping at the same event time, as the simulator does
        order = NODES[:]
        rng.shuffle(order)
        for n, node in enumerate(order):
            ts = T0 + 10.0 * k + (0.0 if same else 0.37 * n)
            rows += batch(node, ts, rng)
            if rng.random() < 0.2:  # a spooled batch: two scrapes of the node back to back
                rows += batch(node, ts + 5.0, rng)
    return rows


def key(got: list[Delivery]) -> list[tuple[Any, ...]]:
    return [
        (
            d.node,
            d.read,
            list(d.stamps or ()),
            [(s.ts, s.reading, s.rate, s.status, s.since) for s in d.samples],
        )
        for d in got
    ]


def test_read_back_hands_the_detectors_what_the_point_by_point_path_does() -> None:
    rng = random.Random(7)
    keep = Keep(DetectionEngine().inputs(), rates_only=True)  # the detection loop's (``keep_for``)
    for _ in range(30):
        rows = stored(rng)
        # reads of any length from any point: batches cut at either end of a read
        for _ in range(20):
            start = rng.randrange(len(rows))
            read = rows[start : start + rng.choice((1, 5, 37, 100, 1000))]
            want = key(deliveries(read, IDENTS, Keep(keep.inputs, rates_only=True)))
            assert key(read_back(read, IDENTS, keep)) == want


def test_whole_scrapes_reach_the_detectors_as_stored_rows() -> None:
    """The point of it: a read of whole scrapes builds no sample per point (``ScrapeRows``), and
    the same node's next scrape reuses the plan (one per node, not per read)."""
    rng = random.Random(3)
    keep = Keep(DetectionEngine().inputs(), rates_only=True)
    first = batch("n1", T0, rng) + batch("n2", T0, rng)
    got = read_back(first, IDENTS, keep)
    assert [(d.node, d.read, type(d.samples)) for d in got] == [("n1", 8, ScrapeRows), ("n2", 8, ScrapeRows)]
    # the engine's inputs only: vl15_dropped left out, the rest kept (3 of 4 series per device)
    assert [len(d.samples) for d in got] == [6, 6]
    plan = keep.plans["n1"]
    again = read_back(batch("n1", T0 + 10, rng), IDENTS, keep)
    assert type(again[0].samples) is ScrapeRows and keep.plans["n1"] is plan


def test_a_point_of_a_series_that_does_not_exist_is_left_out_as_before() -> None:
    rng = random.Random(5)
    rows = batch("n1", T0, rng)
    rows.insert(3, (10_000, T0, 1.0, 1.0, "ok", None))  # no such series (no foreign key)
    keep = Keep(DetectionEngine().inputs(), rates_only=True)
    got = read_back(rows, IDENTS, keep)
    assert key(got) == key(deliveries(rows, IDENTS, Keep(keep.inputs, rates_only=True)))
    assert [(d.node, d.read) for d in got] == [("n1", 9)]  # the point is counted as read, not delivered


def test_without_a_keep_every_sample_is_built_point_by_point() -> None:
    rng = random.Random(9)
    rows = batch("n0", T0, rng) + batch("n3", T0, rng)
    got = read_back(rows, IDENTS, None)
    assert key(got) == key(deliveries(rows, IDENTS)) and all(type(d.samples) is list for d in got)
    assert read_back([], IDENTS, Keep(None)) == []


def shared_identities() -> dict[int, tuple[str, Reading]]:
    """As ``identities``, with one reading object per distinct identity whatever its node, as
    ``Identities`` gives them (``Readings``); n3 sends its devices in the other order."""
    one: dict[tuple[str, str], Reading] = {}
    out: dict[int, tuple[str, Reading]] = {}
    sid = 1
    for node in NODES:
        for device in DEVICES if node != "n3" else DEVICES[::-1]:
            for counter, name, kind in SERIES:
                reading = Reading("infiniband", device, "1", counter, 0.0, "packets", kind, (), name)
                out[sid] = (node, one.setdefault((device, counter), reading))
                sid += 1
    return out


def test_nodes_whose_series_have_the_same_identities_share_one_layout() -> None:
    """Nodes with the same readings in the same order get one layout object, so the detectors
    compile one program for the fleet; a node with its series in another order gets its own.
    Either way in: rows read back (learned row by row, ``_runs``) and the tail's batches (a
    node's first batch learned in bulk, ``plans._learned``). The deliveries and what the reader
    learned are what the point-by-point path gives and learns."""
    idents = shared_identities()
    rng = random.Random(11)
    chunks = []
    for node in NODES:
        mine = [(sid, T0, rng.uniform(0, 1e9), 1.0, "ok", None) for sid, (owner, _) in idents.items() if owner == node]
        chunks.append(Chunk(node, mine, tuple(r[0] for r in mine), T0))
    rows = [row for c in chunks for row in c.rows]
    reference = Keep(DetectionEngine().inputs(), rates_only=True)
    want = key(deliveries(rows, idents, reference))
    for read in (lambda keep: read_back(rows, idents, keep), lambda keep: planned(chunks, idents, keep)):
        keep = Keep(reference.inputs, rates_only=True)
        assert key(read(keep)) == want
        assert keep.known == reference.known  # every series learned, as one by one
        layouts = [keep.plans[node].layout for node in NODES]
        assert layouts[0] is layouts[1] is layouts[2] and layouts[3] is not layouts[0]
        assert len(keep.layouts) == 2
        assert [len(layout.kept) for layout in layouts] == [6, 6, 6, 6]  # vl15_dropped left out
