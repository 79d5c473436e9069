"""Ingest's columnar decode (``fabricd/wire_columns.py``) gives what the row path gives, or hands over.

For any batch, well formed or hostile, ``wire.decode(..., columnar=True)`` must yield the same
samples as the row path, or the same error, and ``ingest.check_limits`` must refuse the same batches
with the same message. The batches are generated (hypothesis) around the fast path's edges: ints
where floats are due, bools, NaN and infinities, -0.0, labels, unknown kinds, wrong row lengths,
strings where numbers are due, NUL characters and over-long fields.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from fabricd import wire
from fabricd.model import Batch, Kind, Status
from fabricd.server.errors import ApiError
from fabricd.server.ingest import check_limits
from fabricd.server.jobreports import split_jobs
from fabricd.server.pathreports import split_paths
from fabricd.server.store.batchrows import point_rows, series_ids
from fabricd.settings import LimitSettings
from fabricd.wire_columns import SampleColumns, columns_of
from tests.support.server import ib_sample, make_batch, sqlite_storage

FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.sampled_from([0.0, -0.0, 1e308, -1e308]),
)
ODD_NUMBERS = st.one_of(
    st.integers(-(2**40), 2**40),
    st.booleans(),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.text(max_size=3),
    st.none(),
    st.lists(st.floats(), max_size=1),
)
TEXT = st.one_of(st.sampled_from(["infiniband", "mlx5_0", "1", "port_xmit_data", "", "a\x00b", "x" * 200]), st.text())
LABELS = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["priority", "tc", "b", "a"]), st.sampled_from(["3", "0", "x" * 300])),
    st.sampled_from([{"k": 1}, "label", [1]]),
)


def _row(good: bool) -> st.SearchStrategy[list[Any]]:
    number = FLOATS if good else st.one_of(FLOATS, ODD_NUMBERS)
    optional = st.one_of(st.none(), number)
    return st.tuples(
        number,
        TEXT,
        TEXT,
        TEXT,
        TEXT,
        TEXT,
        TEXT,
        st.sampled_from([k.value for k in Kind] + ([] if good else ["bogus", 3])),
        LABELS if not good else st.one_of(st.none(), st.just({"priority": "3"})),
        number,
        optional,
        st.sampled_from([s.value for s in Status] + ([] if good else ["bogus"])),
        optional,
    ).map(list)


ROWS = st.one_of(
    st.lists(_row(True), min_size=1, max_size=12),
    st.lists(_row(False), min_size=1, max_size=6),
    st.lists(st.one_of(_row(True), st.lists(FLOATS, max_size=14), st.text(min_size=13, max_size=13)), max_size=4),
)


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except (wire.WireError, ApiError, TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


def _body(rows: list[Any]) -> bytes:
    obj = wire.batch_to_obj(make_batch("node-1", "b-1", [ib_sample(1.0)]), version=1)
    return msgpack.packb({**obj, "samples": rows}, use_bin_type=True)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ROWS)
def test_columnar_decode_and_limits_match_the_row_path(rows: list[Any]) -> None:
    body = _body(rows)
    by_rows = _outcome(lambda: wire.decode(body, wire.MSGPACK))
    by_columns = _outcome(lambda: wire.decode(body, wire.MSGPACK, columnar=True))
    if by_rows[0] != "ok":
        assert by_columns == by_rows
        return
    rows_batch, columns_batch = by_rows[1], by_columns[1]
    assert list(columns_batch.samples) == rows_batch.samples
    assert [s.ts for s in columns_batch.samples] == [s.ts for s in rows_batch.samples]  # -0.0 too
    limits = LimitSettings(max_label_value_length=128)
    assert _outcome(lambda: check_limits(columns_batch, limits)) == _outcome(lambda: check_limits(rows_batch, limits))


def test_well_formed_rows_decode_as_columns_and_the_store_reads_them_as_the_samples() -> None:
    batch = make_batch("node-1", "b-1", [ib_sample(1.0, device=f"mlx5_{i}", rate=float(i)) for i in range(4)])
    batch.samples.append(ib_sample(1.0, counter="rx_prio3_pause", labels=[("priority", "3")], rate=None))
    back = wire.decode(wire.encode(batch, version=2), wire.MSGPACK, gzipped=True, columnar=True)
    assert isinstance(back.samples, SampleColumns) and back.samples == batch.samples
    ids = {s.reading.key(): i for i, s in enumerate(batch.samples)}
    assert series_ids(back.samples, ids) == series_ids(batch.samples, ids) == [0, 1, 2, 3, 4]
    assert point_rows(back.samples, [0, 1, 2, 3, 4]) == point_rows(batch.samples, [0, 1, 2, 3, 4])


def test_an_int_or_a_nan_hands_the_rows_to_the_row_path() -> None:
    good = wire.batch_to_obj(make_batch("n", "b", [ib_sample(1.0)]), version=2)["samples"]
    assert columns_of(good) is not None
    assert columns_of([[1, *good[0][1:]]]) is None  # an int ts: the row path converts it
    assert columns_of([[*good[0][:9], math.nan, *good[0][10:]]]) is None
    assert columns_of([good[0][:12]]) is None and columns_of(["abcdefghijklm"]) is None
    assert columns_of([]) is None


@pytest.mark.parametrize("split", [split_jobs, split_paths])
def test_job_and_path_samples_split_from_columns_as_from_the_samples(split: Any) -> None:
    from fabricd.model import Reading, Sample

    job = Sample(
        5.0, Reading("job", "", "", "job_info", 1.0, "", Kind.INFO, (("job", "42"), ("nodes", "n1")), "job_info")
    )
    running = Sample(5.0, Reading("job", "", "", "running", 1.0, "", Kind.GAUGE, (), "running"))
    hop = Sample(
        5.0,
        Reading("pingmesh", "", "", "path_info", 1.0, "", Kind.INFO, (("peer", "n2"), ("hops", "a,b")), "path_info"),
    )
    batch = make_batch("n1", "b", [ib_sample(5.0), job, running, hop, ib_sample(5.0, device="mlx5_1")])
    columnar = wire.decode(wire.encode(batch, version=2), wire.MSGPACK, gzipped=True, columnar=True)
    assert isinstance(columnar.samples, SampleColumns)
    plain = wire.decode(wire.encode(batch, version=2), wire.MSGPACK, gzipped=True)
    by_columns, by_samples = _outcome(lambda: split(columnar)), _outcome(lambda: split(plain))
    assert by_columns[0] == by_samples[0] == "ok"
    (reports_c, rest_c), (reports_s, rest_s) = by_columns[1], by_samples[1]
    assert reports_c == reports_s and list(rest_c.samples) == list(rest_s.samples)


T0 = 1_800_000_000.0


def _stored(path: Path, batches: list[Batch]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[Any]]:
    """The series rows, raw point chunks and announced series of ``batches`` stored in a fresh
    SQLite store at ``path``, in order."""
    announced: list[Any] = []

    class Listener:
        def committed(self, batches: Any) -> None:
            announced.extend(row for b in batches for row in b.series)

    with sqlite_storage(path) as store:
        store.writer.subscribe(Listener())
        for b in batches:
            store.writer.ingest(b, T0, 10_000)
        with store.engine.connect() as conn:
            series = conn.execute(
                text("SELECT id, node, source, device, port, counter, labels, name, unit, kind FROM series ORDER BY id")
            ).all()
            points = conn.execute(
                text("SELECT id, count, node, ts_min, ts_max, points FROM point_chunks ORDER BY id")
            ).all()
    return [tuple(r) for r in series], [tuple(r) for r in points], announced


def test_a_batch_stored_from_its_columns_is_stored_as_from_its_samples(tmp_path: Path) -> None:
    """New series (a blank name stored as the counter, labels, a series repeated in the batch),
    then the known ones with a new one among them, and a scrape of one time or of several: the
    store fed the decoded columns writes the same series, chunks and announced series as when fed
    the same batch's samples."""
    first = [
        ib_sample(T0, device=f"mlx5_{d}", counter=f"c{c}", name="" if c == 0 else f"n{c}", labels=lab, rate=None)
        for d in range(2)
        for c in range(3)
        for lab in ((), (("prio", "3"), ("tc", "1")))
    ]
    first.append(first[1])  # the same series twice in one batch
    later = [dataclasses.replace(s, ts=T0 + 10.0, rate=2.0) for s in first[:-1]]
    later.append(ib_sample(T0 + 10.5, device="mlx5_9", counter="new", unit="packets", kind=Kind.GAUGE))
    batches = [make_batch("n1", "b1", first, T0), make_batch("n1", "b2", later, T0 + 10.0, seq=2)]
    decoded = [wire.decode(wire.encode(b, version=2), gzipped=True, columnar=True) for b in batches]
    plain = [wire.decode(wire.encode(b, version=2), gzipped=True) for b in batches]
    assert all(isinstance(b.samples, SampleColumns) for b in decoded)
    assert not any(isinstance(b.samples, SampleColumns) for b in plain)
    from_columns, from_rows = _stored(tmp_path / "columns.db", decoded), _stored(tmp_path / "rows.db", plain)
    assert from_columns == from_rows
    series, points, announced = from_columns
    assert len(series) == 13 and len(points) == 2 and len(announced) == 13
    assert {(r[5], r[7]) for r in series if r[3] == "mlx5_0"} == {("c0", "c0"), ("c1", "n1"), ("c2", "n2")}
