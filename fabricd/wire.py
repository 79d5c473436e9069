"""The agent -> central wire format and its versions (docs/wire-format.md).

A batch is one object with short keys. Both encodings (JSON, msgpack) may be gzip-compressed
(``Content-Encoding: gzip``). ``decode`` validates everything it reads and raises ``WireError``
with a message that names the bad field: ingest turns it into a 4xx, never a 5xx.

    {"v": 3, "node": "node-001", "agent": "0.1.0", "id": "<batch id>", "ts": 1700000000.0,
     "instance": "<agent process id>", "seq": 17, "first_ts": 1699999995.0, "last_ts": 1700000000.0,
     "strings": [...], "labels": [...], "columns": {"ts": [...], "source": [...], ...},
     "health": [[collector, success, duration_seconds, ts, error, readings], ...]}

Version 3 carries the samples as columns, their strings in one table (``fabricd/wire_v3.py``).
Version 2 carries them as rows, ``"samples": [[ts, source, device, port, counter, name, unit,
kind, labels, value, rate, status, since], ...]``; version 1 is version 2 without ``instance``,
``seq``, ``first_ts`` and ``last_ts``. One encoder and one decoder per version (``ENCODERS``,
``DECODERS``): a server decodes this version and the ones before it (``SUPPORTED_VERSIONS``), so
agents and the central can be upgraded in either order, one release apart, without losing a
spooled batch.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from fabricd import wire_v3
from fabricd.model import Batch, CollectorHealth, Kind, Reading, Sample, Status
from fabricd.wire_columns import KINDS, SAMPLE_FIELDS, STATUSES, SampleColumns, columns_of, plain_labels
from fabricd.wire_errors import TooLarge, UnsupportedVersion, WireError

# The version this fabricd writes (N); it reads N and N-1 at least (``SUPPORTED_VERSIONS``, the
# keys of ``DECODERS``). Bump it on any change a server of the previous release could not read and
# add its encoder and decoder below (docs/wire-format.md "Versions"). Version 1 is still read: its
# decoder is version 2's, less four fields, and keeping it costs nothing.
SCHEMA_VERSION = 3

JSON = "application/json"
MSGPACK = "application/msgpack"
CONTENT_TYPES = (JSON, MSGPACK, "application/x-msgpack")
# A gzip bomb must not exhaust memory: decompression stops past this many bytes (ingest limit).
DEFAULT_MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
_INF = math.inf
MAX_INSTANCE = 64


def _sample_row(s: Sample) -> list[Any]:
    r = s.reading
    labels = dict(r.labels) if r.labels else None
    return [
        s.ts,
        r.source,
        r.device,
        r.port,
        r.counter,
        r.name,
        r.unit,
        r.kind.value,
        labels,
        r.value,
        s.rate,
        s.status.value,
        s.since,
    ]


def _obj_v1(batch: Batch) -> dict[str, Any]:
    return {**_head(batch, 1), "samples": [_sample_row(s) for s in batch.samples]}


def _head(batch: Batch, version: int) -> dict[str, Any]:
    """A batch's fields of version 1 but its samples."""
    return {
        "v": version,
        "node": batch.node,
        "agent": batch.agent_version,
        "id": batch.batch_id,
        "ts": batch.created_ts,
        "health": [[h.collector, h.success, h.duration_seconds, h.ts, h.error, h.readings] for h in batch.health],
    }


def _ordering(batch: Batch) -> dict[str, Any]:
    """The fields version 2 added."""
    if batch.instance is None or batch.seq is None:
        raise ValueError("a batch of version 2 or later needs instance and seq (made by the Batcher)")
    first, last = event_time_range(batch.samples)
    return {"instance": batch.instance, "seq": batch.seq, "first_ts": first, "last_ts": last}


def _obj_v2(batch: Batch) -> dict[str, Any]:
    return {**_obj_v1(batch), "v": 2, **_ordering(batch)}


def _obj_v3(batch: Batch) -> dict[str, Any]:
    return {**_head(batch, 3), **_ordering(batch), **wire_v3.columns_obj(batch.samples)}


ENCODERS: dict[int, Callable[[Batch], dict[str, Any]]] = {1: _obj_v1, 2: _obj_v2, 3: _obj_v3}


def event_time_range(samples: Sequence[Sample]) -> tuple[float | None, float | None]:
    """(earliest, latest) event time of ``samples``; (None, None) when there are none."""
    if not samples:
        return None, None
    times = samples.ts if isinstance(samples, SampleColumns) else [s.ts for s in samples]
    return min(times), max(times)


def batch_to_obj(batch: Batch, version: int = SCHEMA_VERSION) -> dict[str, Any]:
    encoder = ENCODERS.get(version)
    if encoder is None:
        raise ValueError(f"cannot encode wire version {version}; this fabricd writes {sorted(ENCODERS)}")
    return encoder(batch)


def encode(batch: Batch, content_type: str = MSGPACK, compress: bool = True, version: int = SCHEMA_VERSION) -> bytes:
    obj = batch_to_obj(batch, version)
    if content_type == JSON:
        raw = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    else:
        raw = msgpack.packb(obj, use_bin_type=True)
    return gzip.compress(raw, compresslevel=5) if compress else raw


def _gunzip(body: bytes, limit: int) -> bytes:
    # zlib with wbits=16+MAX_WBITS reads the gzip container; max_length bounds the output.
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise WireError(f"body is not valid gzip: {exc}", "body") from exc
    if len(out) > limit:
        raise TooLarge(f"decompressed batch exceeds {limit} bytes", "body")
    return out


def decode(
    body: bytes,
    content_type: str = MSGPACK,
    gzipped: bool = False,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    columnar: bool = False,
) -> Batch:
    """The batch in ``body``; ``columnar``: its samples as ``SampleColumns`` where the rows allow
    (the central's ingest, ``fabricd/wire_columns.py``), else a list."""
    if gzipped:
        body = _gunzip(body, max_decompressed_bytes)
    base = content_type.split(";", 1)[0].strip().lower()
    try:
        if base == JSON:
            obj = json.loads(body)
        elif base in CONTENT_TYPES:
            obj = msgpack.unpackb(body, raw=False, strict_map_key=True)
        else:
            raise WireError(f"unsupported content type {content_type!r}; use {JSON} or {MSGPACK}", "content-type")
    except WireError:
        raise
    except Exception as exc:  # json/msgpack raise many types on hostile input
        raise WireError(f"body is not valid {base}: {exc}", "body") from exc
    return batch_from_obj(obj, columnar)


def _req(obj: dict[str, Any], key: str, typ: type | tuple[type, ...]) -> Any:
    if key not in obj:
        raise WireError(f"missing field {key!r}", key)
    val = obj[key]
    if not isinstance(val, typ) or (isinstance(val, bool) and typ is not bool):
        raise WireError(f"field {key!r} has the wrong type", key)
    return val


def batch_from_obj(obj: Any, columnar: bool = False) -> Batch:
    if not isinstance(obj, dict):
        raise WireError("batch must be an object", "")
    version = _req(obj, "v", int)
    decoder = DECODERS.get(version)
    if decoder is None:
        speaks = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise UnsupportedVersion(
            f"schema version {version} is not supported (this server speaks {speaks}); "
            "upgrade the central service before the agents, one release at a time",
            "v",
        )
    return decoder(obj, columnar)


def _batch_v1(obj: dict[str, Any], columnar: bool = False) -> Batch:
    batch = _header(obj)
    rows = _req(obj, "samples", list)
    batch.samples = (columnar and columns_of(rows)) or _samples_from_rows(rows)
    return batch


def _header(obj: dict[str, Any]) -> Batch:
    """The batch's fields of version 1, its samples aside."""
    node = _req(obj, "node", str)
    batch_id = _req(obj, "id", str)
    if not node or not batch_id:
        raise WireError("'node' and 'id' must be non-empty", "node" if not node else "id")
    health_rows = obj.get("health", [])
    if not isinstance(health_rows, list):
        raise WireError("field 'health' has the wrong type", "health")
    return Batch(
        node=node,
        agent_version=str(obj.get("agent", "")),
        batch_id=batch_id,
        samples=[],
        health=[_health_from_row(i, row) for i, row in enumerate(health_rows)],
        schema_version=obj["v"],
        created_ts=_number(obj.get("ts", 0.0), "ts") or 0.0,
    )


def _batch_v2(obj: dict[str, Any], columnar: bool = False) -> Batch:
    return _ordered(obj, _batch_v1(obj, columnar))


def _batch_v3(obj: dict[str, Any], columnar: bool = False) -> Batch:
    batch = _header(obj)
    batch.samples = wire_v3.samples_from_obj(obj, columnar)
    return _ordered(obj, batch)


def _ordered(obj: dict[str, Any], batch: Batch) -> Batch:
    """``batch`` with the fields version 2 added: its agent's instance and sequence number, and
    the event time range of its samples."""
    batch.instance = _req(obj, "instance", str)
    if not batch.instance or len(batch.instance) > MAX_INSTANCE:
        raise WireError(f"'instance' must be 1-{MAX_INSTANCE} characters", "instance")
    batch.seq = _req(obj, "seq", int)
    if batch.seq < 1:
        raise WireError("'seq' must be at least 1", "seq")
    for key in ("first_ts", "last_ts"):
        if key not in obj:
            raise WireError(f"missing field {key!r}", key)
    batch.first_ts = _number(obj["first_ts"], "first_ts", optional=True)
    batch.last_ts = _number(obj["last_ts"], "last_ts", optional=True)
    # The range is what the central's per-node watermarks rest on: it must be the samples' own.
    if (batch.first_ts, batch.last_ts) != event_time_range(batch.samples):
        raise WireError("'first_ts'/'last_ts' must be the earliest and latest sample ts", "first_ts")
    return batch


DECODERS: dict[int, Callable[[dict[str, Any], bool], Batch]] = {1: _batch_v1, 2: _batch_v2, 3: _batch_v3}
SUPPORTED_VERSIONS: tuple[int, ...] = tuple(sorted(DECODERS))


def _number(val: Any, where: str, optional: bool = False) -> float | None:
    if val is None and optional:
        return None
    if isinstance(val, bool) or not isinstance(val, int | float):
        raise WireError(f"{where} must be a number", where)
    f = float(val)
    if not math.isfinite(f):
        raise WireError(f"{where} must be finite", where)
    return f


def _text(val: Any, where: str) -> str:
    if not isinstance(val, str):
        raise WireError(f"{where} must be a string", where)
    return val


def _labels(val: Any, where: str) -> tuple[tuple[str, str], ...]:
    if val is None:
        return ()
    if not isinstance(val, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in val.items()):
        raise WireError(f"{where} must be an object of strings", where)
    return tuple(sorted(val.items()))


def _samples_from_rows(rows: list[Any]) -> list[Sample]:
    """Samples of a decoded ``samples`` array: a fast path for well-formed rows, the checked path otherwise.

    The fast path accepts only what the checked path (``_sample_from_row``) would accept unchanged:
    a 13-item list of exact ``str``/``float`` values, a known kind and status, finite numbers
    (``-inf < x < inf`` is False for NaN and the infinities) and labels that are null or an object
    of strings. Anything else (ints, a bad field) goes through ``_sample_from_row``, which converts it or raises
    the error naming the field, so the errors are the same as before. It exists because ingest
    decodes tens of thousands of rows a second (bench/run.py), where the checked path's per-field
    function calls cost more than storing the row.
    """
    out: list[Sample] = []
    append, kinds, statuses, inf = out.append, KINDS, STATUSES, _INF
    for i, row in enumerate(rows):
        if type(row) is list and len(row) == 13:
            ts, source, device, port, counter, name, unit, kind, labels, value, rate, status, since = row
            if (
                type(ts) is float
                and type(value) is float
                and type(source) is str
                and type(device) is str
                and type(port) is str
                and type(counter) is str
                and type(name) is str
                and type(unit) is str
                and type(kind) is str
                and type(status) is str
                and (labels_t := () if labels is None else plain_labels(labels)) is not None
                and -inf < ts < inf
                and -inf < value < inf
                and (rate is None or (type(rate) is float and -inf < rate < inf))
                and (since is None or (type(since) is float and -inf < since < inf))
                and (kind_v := kinds.get(kind)) is not None
                and (status_v := statuses.get(status)) is not None
            ):
                # ``or 0.0`` as the checked path does (it turns -0.0 into 0.0).
                reading = Reading(source, device, port, counter, value or 0.0, unit, kind_v, labels_t, name)
                append(Sample(ts or 0.0, reading, rate, status_v, since))
                continue
        append(_sample_from_row(i, row))
    return out


def _sample_from_row(i: int, row: Any) -> Sample:
    where = f"samples[{i}]"
    if not isinstance(row, Sequence) or isinstance(row, str | bytes) or len(row) != len(SAMPLE_FIELDS):
        raise WireError(f"{where} must be an array of {len(SAMPLE_FIELDS)} fields", where)
    ts, source, device, port, counter, name, unit, kind, labels, value, rate, status, since = row
    try:
        kind_v, status_v = Kind(kind), Status(status)
    except ValueError as exc:
        raise WireError(f"{where}: {exc}", where) from exc
    reading = Reading(
        source=_text(source, f"{where}.source"),
        device=_text(device, f"{where}.device"),
        port=_text(port, f"{where}.port"),
        counter=_text(counter, f"{where}.counter"),
        name=_text(name, f"{where}.name"),
        unit=_text(unit, f"{where}.unit"),
        kind=kind_v,
        labels=_labels(labels, f"{where}.labels"),
        value=_number(value, f"{where}.value") or 0.0,
    )
    return Sample(
        ts=_number(ts, f"{where}.ts") or 0.0,
        reading=reading,
        rate=_number(rate, f"{where}.rate", optional=True),
        status=status_v,
        since=_number(since, f"{where}.since", optional=True),
    )


def _health_from_row(i: int, row: Any) -> CollectorHealth:
    where = f"health[{i}]"
    if not isinstance(row, Sequence) or isinstance(row, str | bytes) or len(row) != 6:
        raise WireError(f"{where} must be an array of 6 fields", where)
    collector, success, duration, ts, error, readings = row
    return CollectorHealth(
        collector=_text(collector, f"{where}.collector"),
        success=bool(success),
        duration_seconds=_number(duration, f"{where}.duration_seconds") or 0.0,
        ts=_number(ts, f"{where}.ts") or 0.0,
        error=_text(error, f"{where}.error"),
        readings=_count(readings, f"{where}.readings"),
    )


MAX_COUNT = 2**63 - 1  # what the stores' BIGINT columns (and SQLite's INTEGER) hold


def _count(val: Any, where: str) -> int:
    """A non-negative count that fits a 64-bit column (a larger one crashed the store: a 500)."""
    n = _number(val, where) or 0.0
    if n < 0 or n > MAX_COUNT or n != int(n):
        raise WireError(f"{where} must be a whole number from 0 to 2^63-1", where)
    return int(n)
