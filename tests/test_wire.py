"""The agent -> central wire format: round trips and errors that name the field."""

from __future__ import annotations

import gzip
import json

import msgpack
import pytest

from fabricd import wire
from fabricd.model import Kind, Reading, Sample, Status
from tests.support.server import ib_sample, make_batch

SATURATED = Sample(
    10.0,
    Reading("infiniband", "mlx5_0", "1", "symbol_error", 65535.0, "", Kind.COUNTER, (), "symbol_errors", 16, True),
    None,
    Status.SATURATED,
    since=5.0,
)
PFC = Sample(
    10.0,
    Reading(
        "ethtool",
        "eth0",
        "",
        "rx_prio3_pause_duration",
        0.25,
        "seconds",
        Kind.COUNTER,
        (("priority", "3"),),
        "rx_pause_duration",
    ),
    0.1,
)


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("columnar", [False, True])
@pytest.mark.parametrize("content_type", [wire.JSON, wire.MSGPACK])
@pytest.mark.parametrize("compress", [True, False])
def test_round_trip_keeps_every_field(content_type: str, compress: bool, columnar: bool, version: int) -> None:
    batch = make_batch("node-1", "b-1", [ib_sample(1.0), SATURATED, PFC], ts=12.5)
    body = wire.encode(batch, content_type, compress, version=version)
    back = wire.decode(body, content_type, gzipped=compress, columnar=columnar)
    # What survives is what the server stores: width/saturates/scale stay at the agent.
    assert [
        (s.ts, s.reading.key(), s.reading.metric, s.reading.value, s.rate, s.status, s.since) for s in back.samples
    ] == [(s.ts, s.reading.key(), s.reading.metric, s.reading.value, s.rate, s.status, s.since) for s in batch.samples]
    assert (back.node, back.batch_id, back.agent_version, back.created_ts) == ("node-1", "b-1", "0.1.0", 12.5)
    assert back.health == batch.health


def test_msgpack_is_smaller_than_json() -> None:
    batch = make_batch("node-1", "b", [ib_sample(float(i), device=f"mlx5_{i % 8}") for i in range(500)])
    assert len(wire.encode(batch, wire.MSGPACK, False)) < len(wire.encode(batch, wire.JSON, False))


def _obj() -> dict[str, object]:
    """A version 2 batch: its samples are rows."""
    return wire.batch_to_obj(make_batch("n", "b", [ib_sample(1.0)]), version=2)


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda o: o.pop("node"), "node"),
        (lambda o: o["samples"][0].__setitem__(1, 1.0), "samples[0].source"),
        (lambda o: o["samples"][0].__setitem__(7, "histogram"), "samples[0]"),
        (lambda o: o["samples"][0].__setitem__(9, "NaN"), "samples[0].value"),
        (lambda o: o["samples"][0].__setitem__(8, {"priority": 3}), "samples[0].labels"),
        (lambda o: o.update(health=[["x", True]]), "health[0]"),
        # a count past 64 bits made the store raise (HTTP 500), found by schemathesis
        (lambda o: o.update(health=[["x", True, 0.1, 1.0, "", 1712450407832583405568]]), "health[0].readings"),
        (lambda o: o.update(health=[["x", True, 0.1, 1.0, "", -1]]), "health[0].readings"),
        (lambda o: o.update(ts=[1]), "ts"),
        (lambda o: o.update(samples={"a": 1}), "samples"),
    ],
)
def test_invalid_batches_name_the_field(mutate: object, field: str) -> None:
    obj = _obj()
    assert callable(mutate)
    mutate(obj)
    with pytest.raises(wire.WireError) as err:
        wire.decode(json.dumps(obj).encode(), wire.JSON)
    assert err.value.field == field


def test_unknown_version_and_content_type_and_gzip_bomb() -> None:
    with pytest.raises(
        wire.UnsupportedVersion, match=r"schema version 4 is not supported \(this server speaks 1, 2, 3\)"
    ):
        wire.decode(msgpack.packb({**_obj(), "v": 4}), wire.MSGPACK)
    with pytest.raises(wire.UnsupportedVersion, match="schema version 0 "):
        wire.decode(msgpack.packb({**_obj(), "v": 0}), wire.MSGPACK)
    with pytest.raises(wire.WireError) as err:
        wire.decode(b"{}", "text/csv")
    assert err.value.field == "content-type"
    bomb = gzip.compress(b"[" + b" " * 2_000_000 + b"]")
    with pytest.raises(wire.TooLarge):
        wire.decode(bomb, wire.JSON, gzipped=True, max_decompressed_bytes=1_000_000)


def test_this_release_writes_version_3_and_reads_1_2_and_3() -> None:
    assert (wire.SCHEMA_VERSION, wire.SUPPORTED_VERSIONS) == (3, (1, 2, 3))
    assert sorted(wire.ENCODERS) == sorted(wire.DECODERS) == [1, 2, 3]


@pytest.mark.parametrize("content_type", [wire.JSON, wire.MSGPACK])
@pytest.mark.parametrize("version", [2, 3])
def test_versions_2_and_3_carry_instance_seq_and_the_event_time_range(content_type: str, version: int) -> None:
    batch = make_batch("node-1", "b-7", [ib_sample(30.0), ib_sample(10.0, device="mlx5_1"), PFC], seq=7)
    obj = wire.batch_to_obj(batch, version)
    layout = {2: ["samples"], 3: ["columns", "labels", "strings"]}[version]  # the previous release's: 2
    assert sorted(obj) == sorted(
        ["agent", "health", "id", "node", "ts", "v", "instance", "seq", "first_ts", "last_ts", *layout]
    )
    assert {k: obj[k] for k in ("v", "instance", "seq", "first_ts", "last_ts")} == {
        "v": version,
        "instance": "test-instance",
        "seq": 7,
        "first_ts": 10.0,
        "last_ts": 30.0,
    }
    back = wire.decode(wire.encode(batch, content_type, version=version), content_type, gzipped=True)
    assert (back.schema_version, back.instance, back.seq, back.first_ts, back.last_ts) == (
        version,
        "test-instance",
        7,
        10.0,
        30.0,
    )


def test_version_1_has_none_of_the_new_fields_and_decodes_with_them_none() -> None:
    batch = make_batch("node-1", "b-1", [ib_sample(10.0), ib_sample(20.0)])
    obj = wire.batch_to_obj(batch, version=1)
    assert sorted(obj) == ["agent", "health", "id", "node", "samples", "ts", "v"]
    back = wire.decode(wire.encode(batch, wire.JSON, False, version=1), wire.JSON)
    assert (back.schema_version, back.instance, back.seq, back.first_ts, back.last_ts) == (1, None, None, None, None)
    assert [s.ts for s in back.samples] == [10.0, 20.0]


@pytest.mark.parametrize("version", [2, 3])
def test_a_batch_without_samples_has_a_null_range(version: int) -> None:
    back = wire.decode(wire.encode(make_batch("n", "b", []), wire.JSON, False, version), wire.JSON, columnar=True)
    assert (back.first_ts, back.last_ts, back.seq, back.samples) == (None, None, 1, [])


def _obj2(**changes: object) -> bytes:
    obj = wire.batch_to_obj(make_batch("n", "b", [ib_sample(1.0), ib_sample(2.0)]), version=2)
    obj.update(changes)
    return json.dumps({k: v for k, v in obj.items() if v != "DROP"}).encode()


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"instance": "DROP"}, "instance"),
        ({"instance": ""}, "instance"),
        ({"instance": "x" * 65}, "instance"),
        ({"seq": "DROP"}, "seq"),
        ({"seq": 0}, "seq"),
        ({"seq": 1.5}, "seq"),
        ({"seq": True}, "seq"),
        ({"first_ts": "DROP"}, "first_ts"),
        ({"last_ts": "DROP"}, "last_ts"),
        ({"first_ts": "1"}, "first_ts"),
        ({"first_ts": 0.5}, "first_ts"),  # not the samples' earliest
        ({"last_ts": None}, "first_ts"),
    ],
)
def test_invalid_version_2_fields_are_named(changes: dict[str, object], field: str) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.decode(_obj2(**changes), wire.JSON)
    assert err.value.field == field


def test_encoding_version_2_needs_instance_and_seq() -> None:
    batch = make_batch("n", "b", [])
    batch.instance = None
    with pytest.raises(ValueError, match="needs instance and seq"):
        wire.encode(batch)
    with pytest.raises(ValueError, match="cannot encode wire version 4"):
        wire.encode(make_batch("n", "b", []), version=4)
