"""The engine's intake of a stored scrape through its layout's program (``fabricd.detect.absorb``)
against its intake of the same samples one by one (``DetectionEngine._absorb``)."""

from __future__ import annotations

import gc
from typing import Any

from fabricd.detect.absorb import Programs, compile_layout
from fabricd.detect.engine import RUN_HOST, DetectionEngine
from fabricd.detect.signals import WANTED
from fabricd.model import Kind, Reading, Sample, Status, labels_of
from fabricd.scrape_rows import BUILD, SHARE, Layout, ScrapeRows

TS = 1_796_000_000.0


def _ib(device: str, port: str, name: str, value: float, kind: Kind = Kind.COUNTER) -> Reading:
    return Reading("infiniband", device, port, name, value, "bytes", kind, (), name)


# A scrape as an agent sends it, in its order: what the engine reads and what it does not.
SCRAPE: list[tuple[Reading, float | None]] = [
    (_ib("mlx5_0", "1", "port_transmit_data", 0.0), 4.0e9),
    (_ib("mlx5_0", "1", "port_receive_data", 0.0), None),  # no honest rate (a reset): no input
    (_ib("mlx5_0", "1", "link_rate", 5.0e10, Kind.GAUGE), None),  # a gauge: its value
    (_ib("mlx5_0", "1", "vl15_dropped", 0.0), 7.0),  # not an input of the engine
    (_ib("mlx5_0", "2", "port_transmit_data", 0.0), 1.0e9),  # another port of the same device
    (_ib("mlx5_1", "1", "port_transmit_data", 0.0), 2.0e9),  # another device, the same port
    (_ib("mlx5_1", "1", "port_transmit_data", 0.0), 3.0e9),  # a repeat: the last one wins
    (_ib("mlx5_1", "1", "port_state", 4.0, Kind.GAUGE), None),
    (Reading("pingmesh", "node-2", "", "rtt_min_seconds", 3e-6, "seconds", Kind.GAUGE, labels_of({"tos": "0"})), None),
    (Reading("pingmesh", "node-2", "", "rtt_min_seconds", 4e-6, "seconds", Kind.GAUGE, labels_of({"tos": "96"})), None),
    (Reading("nccl", "all_reduce", "", "run_host", 1.0, "", Kind.INFO, labels_of({"host": "a"}), RUN_HOST), None),
    (Reading("nccl", "all_reduce", "", "run_host", 1.0, "", Kind.INFO, labels_of({"host": "b"}), RUN_HOST), None),
    (Reading("nccl", "all_reduce", "", "aborted", 1.0, "", Kind.EVENT, (), "time_seconds"), None),  # an event
    (Reading("elsewhere", "x", "", "time_seconds", 1.0, "s", Kind.GAUGE, (), "time_seconds"), None),  # no source
    (_ib("mlx5_0", "1", "port_receive_data", 0.0), 6.0e9),  # the device again, after others
    (_ib("mlx5_0", "1", "port_transmit_data", 0.0), None),  # a repeat without a rate: no input
]


def _stored(scrape: list[tuple[Reading, float | None]], ts: float) -> ScrapeRows:
    """The scrape as the stream hands it on: its rows, and the layout a ``Keep`` of the engine's
    inputs makes (counters shared as their identity, every other reading built per point)."""
    rows = []
    kept, entries = [], []
    for i, (r, rate) in enumerate(scrape):
        rows.append((i + 1, ts, r.value, rate, "ok" if rate is not None else "reset", None))
        identity = Reading(r.source, r.device, r.port, r.counter, 0.0, r.unit, r.kind, r.labels, r.name)
        if r.source in WANTED or r.source == "elsewhere":
            kept.append(i)
            entries.append((identity, SHARE if r.kind is Kind.COUNTER else BUILD))
    return ScrapeRows(Layout(tuple(kept), tuple(entries)), rows, ts)


def _state(engine: DetectionEngine) -> dict[str, Any]:
    records = {key: (r.ts, r.dirty, r.scopes) for key, r in engine._records.items()}
    return {"records": records, "run_hosts": engine.run_hosts, "dirty": [(r.node, r.device) for r in engine._dirty]}


def test_a_stored_scrape_leaves_the_engine_as_its_samples_do() -> None:
    """Two scrapes of two nodes, read as stored rows and as the samples those rows build: the same
    records, scopes (the repeat's last value, the reset counter left out, gauges' values, the
    readings the engine does not read left out) and NCCL run hosts."""
    by_rows, by_samples = DetectionEngine(), DetectionEngine()
    for k in range(2):
        scrapes = [(node, _stored(SCRAPE, TS + 10 * k + j)) for j, node in enumerate(("node-1", "node-2"))]
        by_rows._absorb(scrapes, {}, rounds=False)
        by_samples._absorb([(node, list(rows)) for node, rows in scrapes], {}, rounds=False)
        assert _state(by_rows) == _state(by_samples)
        assert _state(by_rows)["records"][("node-1", "infiniband", "mlx5_0")][2] == {
            ("1", ()): {"port_receive_data": 6.0e9, "link_rate": 5.0e10},
            ("2", ()): {"port_transmit_data": 1.0e9},
        }
        by_rows._flush()
        by_samples._flush()
    got = _state(by_rows)
    assert got["records"][("node-1", "infiniband", "mlx5_0")][2] == {}  # flushed
    assert got["run_hosts"] == {
        "node-1": [(TS, {"a", "b"}), (TS + 10, {"a", "b"})],
        "node-2": [(TS + 1, {"a", "b"}), (TS + 11, {"a", "b"})],
    }


def test_the_samples_a_stored_scrape_builds_are_the_streams() -> None:
    """A consumer that iterates a ``ScrapeRows`` gets what ``plans.deliveries`` builds: a counter
    with its identity as reading, a gauge with a reading of its value, the status and the time."""
    rows = _stored(SCRAPE[:3], TS)
    assert len(rows) == 3 and rows[0] is rows.samples()[0]
    assert [(s.ts, s.reading.counter, s.reading.value, s.rate, s.status) for s in rows] == [
        (TS, "port_transmit_data", 0.0, 4.0e9, Status.OK),
        (TS, "port_receive_data", 0.0, None, Status.RESET),
        (TS, "link_rate", 5.0e10, None, Status.RESET),
    ]
    assert rows[1:] == [rows[1], rows[2]] and all(isinstance(s, Sample) for s in rows)


def test_a_layouts_program_is_made_once_and_keeps_the_rows_order() -> None:
    """One program per layout, by identity; it groups runs of a device and of a scope without
    reordering them (the device read again after others is a run of its own)."""
    programs = Programs(WANTED, RUN_HOST)
    layout = _stored(SCRAPE, TS).layout
    program = programs.of(layout)
    assert programs.of(layout) is program and programs.of(_stored(SCRAPE, TS).layout) is not program
    assert [(src, dev, [where for where, _ in scopes]) for src, dev, scopes in program.records] == [
        ("infiniband", "mlx5_0", [("1", ()), ("2", ())]),
        ("infiniband", "mlx5_1", [("1", ())]),
        ("pingmesh", "node-2", [("", (("tos", "0"),)), ("", (("tos", "96"),))]),
        ("infiniband", "mlx5_0", [("1", ())]),
    ]
    assert program.hosts == ((("host", "a"),), (("host", "b"),))
    assert compile_layout(Layout((), ()), WANTED, RUN_HOST) == ((), ())


def test_a_layouts_program_lives_as_long_as_the_layout() -> None:
    """The reader keeps one layout per node; every read's cut batches make layouts that live only
    as long as their scrapes. Their programs go with them (held strongly, two a read piled up)."""
    programs = Programs(WANTED, RUN_HOST)
    kept = _stored(SCRAPE, TS).layout
    program = programs.of(kept)
    for k in range(100):  # a read's cut batches, each with a layout of its own
        programs.of(_stored(SCRAPE[: k % 7 + 1], TS + k).layout)
    gc.collect()
    assert len(programs) == 1 and programs.of(kept) is program
    del kept
    gc.collect()
    assert len(programs) == 0
