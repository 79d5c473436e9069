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


@pytest.mark.parametrize("content_type", [wire.JSON, wire.MSGPACK])
@pytest.mark.parametrize("compress", [True, False])
def test_round_trip_keeps_every_field(content_type: str, compress: bool) -> None:
    batch = make_batch("node-1", "b-1", [ib_sample(1.0), SATURATED, PFC], ts=12.5)
    back = wire.decode(wire.encode(batch, content_type, compress), content_type, gzipped=compress)
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
    return wire.batch_to_obj(make_batch("n", "b", [ib_sample(1.0)]))


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda o: o.pop("node"), "node"),
        (lambda o: o["samples"][0].__setitem__(1, 1.0), "samples[0].source"),
        (lambda o: o["samples"][0].__setitem__(7, "histogram"), "samples[0]"),
        (lambda o: o["samples"][0].__setitem__(9, "NaN"), "samples[0].value"),
        (lambda o: o["samples"][0].__setitem__(8, {"priority": 3}), "samples[0].labels"),
        (lambda o: o.update(health=[["x", True]]), "health[0]"),
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
    with pytest.raises(wire.UnsupportedVersion, match="schema version 2"):
        wire.decode(msgpack.packb({**_obj(), "v": 2}), wire.MSGPACK)
    with pytest.raises(wire.WireError) as err:
        wire.decode(b"{}", "text/csv")
    assert err.value.field == "content-type"
    bomb = gzip.compress(b"[" + b" " * 2_000_000 + b"]")
    with pytest.raises(wire.TooLarge):
        wire.decode(bomb, wire.JSON, gzipped=True, max_decompressed_bytes=1_000_000)
