"""Wire version 3 (``fabricd/wire_v3.py``): samples as columns, their strings in one table. The
same samples as version 2 after decoding, and every bad column named."""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricd import wire
from fabricd.model import Kind, Reading, Sample, Status
from fabricd.server.ingest import check_limits
from fabricd.settings import LimitSettings
from fabricd.wire_columns import SAMPLE_FIELDS, SampleColumns
from fabricd.wire_v3 import STRING_FIELDS
from tests.support.server import ib_sample, make_batch
from tests.test_wire import PFC, SATURATED
from tests.test_wire_columns import _outcome, _row


def _batch() -> Any:
    return make_batch("n", "b", [ib_sample(5.0), ib_sample(5.0, device="mlx5_1", rate=None), PFC], ts=9.0)


def test_each_string_is_sent_once_and_the_columns_index_it() -> None:
    obj = wire.batch_to_obj(_batch(), version=3)
    assert "samples" not in obj
    assert obj["strings"] == [
        "infiniband",
        "ethtool",
        "mlx5_0",
        "mlx5_1",
        "eth0",
        "1",
        "",
        "port_xmit_data",
        "rx_prio3_pause_duration",
        "port_transmit_data",
        "rx_pause_duration",
        "bytes",
        "seconds",
        "counter",
        "ok",
        "first",  # the status of a sample without a rate
    ]
    assert obj["labels"] == [None, {"priority": "3"}]
    assert obj["columns"] == {
        "ts": [5.0, 5.0, 10.0],
        "source": [0, 0, 1],
        "device": [2, 3, 4],
        "port": [5, 5, 6],
        "counter": [7, 7, 8],
        "name": [9, 9, 10],
        "unit": [11, 11, 12],
        "kind": [13, 13, 13],
        "labels": [0, 0, 1],
        "value": [4096.0, 4096.0, 0.25],
        "rate": [1e9, None, 0.1],
        "status": [14, 15, 14],
        "since": [None, None, None],
    }


@pytest.mark.parametrize("content_type", [wire.JSON, wire.MSGPACK])
def test_version_3_decodes_to_the_columns_version_2_decodes_to(content_type: str) -> None:
    """A fleet-like batch (one scrape, eight ports, labels, a saturated counter, a -0.0): ingest
    stores exactly what it stored from version 2, and versions 2 and 3 build the same samples."""
    zero = Sample(5.0, Reading("infiniband", "mlx5_7", "1", "port_rcv_data", -0.0, "bytes", Kind.COUNTER), 0.0)
    samples = [ib_sample(5.0, device=f"mlx5_{i % 8}", counter=f"c{i}") for i in range(40)] + [SATURATED, PFC, zero]
    batch = make_batch("n", "b", samples, seq=3)
    v2, v3 = (
        wire.decode(wire.encode(batch, content_type, version=v), content_type, gzipped=True, columnar=True)
        for v in (2, 3)
    )
    assert isinstance(v3.samples, SampleColumns) and v3.samples == v2.samples
    assert v3.samples.value[-1] == 0.0 and str(v3.samples.value[-1]) == "0.0"
    assert v3.samples.status[40] is Status.SATURATED.value  # the enum's own string, as version 2's
    rows = [wire.decode(wire.encode(batch, content_type, version=v), content_type, gzipped=True) for v in (2, 3)]
    assert rows[0].samples == rows[1].samples and isinstance(rows[1].samples, list)
    sizes = [len(wire.encode(batch, content_type, compress=False, version=v)) for v in (2, 3)]
    assert sizes[1] < sizes[0]


def test_integral_numbers_are_taken_as_floats_and_a_repeated_time_as_one() -> None:
    obj = wire.batch_to_obj(_batch(), version=3)
    obj["columns"].update(ts=[5, 5, 10], value=[4096, 4096.0, 0.25], rate=[1, None, 0.1])
    obj["first_ts"], obj["last_ts"] = 5, 10
    back = wire.decode(json.dumps(obj).encode(), wire.JSON, columnar=True).samples
    assert isinstance(back, SampleColumns)
    assert (back.ts, back.value, back.rate) == ((5.0, 5.0, 10.0), (4096.0, 4096.0, 0.25), (1.0, None, 0.1))
    assert {type(x) for column in (back.ts, back.value) for x in column} == {float}


def _columns(**changes: Any) -> dict[str, Any]:
    obj = wire.batch_to_obj(_batch(), version=3)
    obj["columns"].update(changes)
    return obj


@pytest.mark.parametrize(
    "obj,field",
    [
        ({**_columns(), "columns": [1]}, "columns"),
        ({**_columns(), "strings": "infiniband"}, "strings"),
        ({**_columns(), "labels": None}, "labels"),
        (_columns(device=None), "columns.device"),
        (_columns(value=[1.0, 2.0]), "columns.value"),
        (_columns(counter=[7, 99, 8]), "columns.counter[1]"),
        (_columns(port=[-1, 5, 6]), "columns.port[0]"),
        (_columns(unit=["bytes", 11, 12]), "columns.unit[0]"),
        (_columns(source=[0, [0], 1]), "columns.source[1]"),
        (_columns(labels=[0, 0, 2]), "columns.labels[2]"),
        (_columns(kind=[13, 13, 0]), "columns.kind[2]"),  # "infiniband" is not a kind
        (_columns(status=[14, 13, 15]), "columns.status[1]"),  # nor "counter" a status
        (_columns(ts=[5.0, float("nan"), 10.0]), "columns.ts[1]"),
        (_columns(value=[4096.0, float("inf"), 0.25]), "columns.value[1]"),
        (_columns(value=[4096.0, "1", 0.25]), "columns.value[1]"),
        (_columns(rate=[True, None, 0.1]), "columns.rate[0]"),
        ({**_columns(), "strings": [1, *_columns()["strings"][1:]]}, "strings[0]"),
        ({**_columns(), "labels": [None, {"priority": 3}]}, "labels[1]"),
    ],
)
def test_a_bad_column_is_named(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.decode(msgpack.packb(obj), wire.MSGPACK, columnar=True)
    assert err.value.field == field


def test_a_number_past_a_float_is_not_finite() -> None:
    obj = _columns()
    body = json.dumps(obj).replace("4096.0, 4096.0", "4096.0, 1" + "0" * 400).encode()
    with pytest.raises(wire.WireError) as err:
        wire.decode(body, wire.JSON)
    assert (err.value.field, str(err.value)) == ("columns.value[1]", "columns.value[1] must be finite")


def _v3_body(rows: list[list[Any]]) -> bytes:
    """Rows as version 2 carries them, well formed or hostile, as version 3's columns: each
    distinct string (or whatever stands in a string's place) once in the table."""
    obj = wire.batch_to_obj(make_batch("node-1", "b-1", [ib_sample(1.0)]), version=1)
    table: dict[Any, int] = {}
    sets: dict[str, int] = {}
    label_sets: list[Any] = []
    columns: dict[str, list[Any]] = {field: [] for field in SAMPLE_FIELDS}
    for row in rows:
        for field, value in zip(SAMPLE_FIELDS, row, strict=True):
            if field in STRING_FIELDS:
                value = table.setdefault((type(value), json.dumps(value)), len(table))
            elif field == "labels":
                key = json.dumps(value, sort_keys=True)
                if key not in sets:
                    sets[key] = len(label_sets)
                    label_sets.append(value)
                value = sets[key]
            columns[field].append(value)
    strings = [json.loads(text) for _, text in table]
    return msgpack.packb({**obj, "v": 1, "strings": strings, "labels": label_sets, "columns": columns})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_row(True), _row(False)), min_size=1, max_size=8))
def test_version_3_accepts_and_refuses_what_version_2_does(rows: list[list[Any]]) -> None:
    """The same rows, hostile ones included (ints, bools, NaN, -0.0, odd labels, unknown kinds,
    NUL and over-long strings), as version 2 rows and as version 3 columns: both decode to the
    same samples, or both are refused; and ingest's limits then say the same of both."""
    v2 = wire.batch_to_obj(make_batch("node-1", "b-1", [ib_sample(1.0)]), version=1)
    by_rows = _outcome(lambda: wire.decode(msgpack.packb({**v2, "samples": rows}), wire.MSGPACK, columnar=True))
    obj = msgpack.unpackb(_v3_body(rows))
    by_columns = _outcome(
        lambda: wire.decode(msgpack.packb({**obj, "v": 3, **_range(obj)}), wire.MSGPACK, columnar=True)
    )
    assert (by_columns[0] == "ok") == (by_rows[0] == "ok"), (by_rows, by_columns)
    if by_rows[0] != "ok":
        return
    rows_batch, columns_batch = by_rows[1], by_columns[1]
    assert list(columns_batch.samples) == list(rows_batch.samples)
    assert [str(s.ts) for s in columns_batch.samples] == [str(s.ts) for s in rows_batch.samples]  # -0.0 too
    limits = LimitSettings(max_label_value_length=128)
    assert _outcome(lambda: check_limits(columns_batch, limits)) == _outcome(lambda: check_limits(rows_batch, limits))


def _range(obj: dict[str, Any]) -> dict[str, Any]:
    """Version 3's instance, seq and event time range (first_ts/last_ts of the ts column when its
    items are numbers; a bad ts is refused by the column's own check first)."""
    ts = obj["columns"]["ts"]
    numbers = [float(t) for t in ts if type(t) in (int, float) and math.isfinite(t)]
    ok = len(numbers) == len(ts)
    return {
        "instance": "i",
        "seq": 1,
        "first_ts": min(numbers) if ok else None,
        "last_ts": max(numbers) if ok else None,
    }


@pytest.mark.parametrize("version", [1, 2, 3])
def test_the_documented_schema_takes_each_version_the_server_reads(version: int) -> None:
    """``/openapi.json``'s batch schema (what /docs shows and schemathesis generates from)
    takes what the encoder writes, and a version 3 batch without its columns fails it."""
    from fabricd.server.routes.ingest import BATCH_SCHEMA

    validator = jsonschema.Draft202012Validator(BATCH_SCHEMA)
    obj = json.loads(json.dumps(wire.batch_to_obj(_batch(), version)))
    validator.validate(obj)
    if version == 3:
        assert not validator.is_valid({k: v for k, v in obj.items() if k != "columns"})
        assert not validator.is_valid({**obj, "columns": {**obj["columns"], "device": [-1, 0, 0]}})
