"""NCCL Inspector output, parsed: per-rank collective records from its JSON lines or Prometheus files.

NCCL Inspector (``plugins/profiler/inspector`` in NVIDIA/nccl, since 2.28.3) writes, per rank and
communicator, one record per collective:

- JSON lines (default): ``{"header": {id, rank, n_ranks, nnodes}, "metadata": {hostname,
  dump_timestamp_us, ...}, "coll_perf": {coll, coll_sn, coll_msg_size_bytes, coll_exec_time_us,
  coll_algobw_gbs, coll_busbw_gbs}}``; format v4.3 writes the header and metadata once per dump in
  a record with ``dump_stats`` and then bare ``{"coll_perf": ...}`` records (the plugin's
  ``inspector_json_reader.py``). The job id is not in the records: it is the dump folder's name,
  ``nccl-inspector-<SLURM_JOB_ID>``, unless ``NCCL_INSPECTOR_DUMP_DIR`` says otherwise.
- Prometheus textfiles (``NCCL_INSPECTOR_PROM_DUMP=1``, ``nccl_inspector_metrics_<GPU UUID>.prom``,
  rewritten at most every 30 s): ``nccl_algorithm_bandwidth_gbs``, ``nccl_bus_bandwidth_gbs``,
  ``nccl_collective_exec_time_microseconds``, labelled ``comm_id``, ``hostname``, ``rank``,
  ``slurm_job_id``, ``nranks``, ``n_nodes``, ``collective``, ``coll_sn``, ``message_size``
  (``inspector_prom.cc``; its README spells ``n_ranks``, both are read).

GB/s here are 10^9 bytes/s (NCCL's busbw convention, as nccl-tests).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

GB = 1e9
_PROM_LINE = re.compile(r"^(nccl_[a-z_]+)\{(.*)\}\s+(\S+)\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_SIZE = re.compile(r"^([0-9.]+)(B|KB|MB|GB|TB)$")
_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}  # inspectorFormatHumanReadableSize
_PROM_VALUES = {
    "nccl_collective_exec_time_microseconds": "exec",
    "nccl_bus_bandwidth_gbs": "busbw",
    "nccl_algorithm_bandwidth_gbs": "algbw",
}


@dataclass(frozen=True, slots=True)
class CollRecord:
    """One rank's view of one collective on one communicator."""

    job_id: str
    comm: str
    rank: int
    n_ranks: int
    host: str
    coll: str
    seq: int
    message_size_bytes: float
    exec_time_seconds: float
    busbw_bytes_per_second: float
    algbw_bytes_per_second: float
    n_nodes: int = 0  # nodes of the communicator (0: not said)


@dataclass(slots=True)
class Parsed:
    records: list[CollRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "line 3: ..." per record that could not be used


def job_of_folder(name: str) -> str:
    """``nccl-inspector-1234`` -> ``1234``; ``""`` for ``nccl-inspector-unknown-jobid`` or another name."""
    job = name.removeprefix("nccl-inspector-")
    return job if job != name and job[:1].isdigit() else ""


def message_size(text: str) -> float:
    m = _SIZE.match(text.strip())
    if m is None:
        raise ValueError(f"message_size {text!r} is not a size such as 2.00GB")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_prom(text: str) -> Parsed:
    """A Prometheus textfile the plugin wrote: one record per label set (the three metrics merged)."""
    out = Parsed()
    by_key: dict[tuple[tuple[str, str], ...], dict[str, object]] = {}
    for i, line in enumerate(text.splitlines(), 1):
        m = _PROM_LINE.match(line)
        if m is None or m.group(1) not in _PROM_VALUES:
            continue
        labels = dict(_LABEL.findall(m.group(2)))
        key = tuple(sorted(labels.items()))
        try:
            by_key.setdefault(key, {"labels": labels, "line": i})[_PROM_VALUES[m.group(1)]] = float(m.group(3))
        except ValueError:
            out.errors.append(f"line {i}: value {m.group(3)!r} is not a number")
    for entry in by_key.values():
        try:
            out.records.append(_prom_record(entry))
        except (KeyError, ValueError) as exc:
            out.errors.append(f"line {entry['line']}: {exc}")
    return out


def _prom_record(entry: dict[str, object]) -> CollRecord:
    labels = entry["labels"]
    assert isinstance(labels, dict)
    job = labels.get("slurm_job_id", "")
    return CollRecord(
        job_id="" if job == "unknown" else job,
        comm=labels["comm_id"],
        rank=int(labels["rank"]),
        n_ranks=int(labels.get("nranks") or labels.get("n_ranks") or 0),
        host=labels.get("hostname", ""),
        coll=labels["collective"],
        seq=int(labels.get("coll_sn", "0")),
        message_size_bytes=message_size(labels["message_size"]),
        exec_time_seconds=float(entry["exec"]) / 1e6,  # type: ignore[arg-type]
        busbw_bytes_per_second=float(entry["busbw"]) * GB,  # type: ignore[arg-type]
        algbw_bytes_per_second=float(entry["algbw"]) * GB,  # type: ignore[arg-type]
        n_nodes=int(labels.get("n_nodes") or 0),
    )


def parse_jsonl(text: str, job_id: str, first_line: int = 1) -> Parsed:
    """JSON lines the plugin wrote (v4.0-v4.3); ``job_id`` from the dump folder (``job_of_folder``)."""
    out = Parsed()
    context: dict[str, dict[str, object]] = {}
    for i, line in enumerate(text.splitlines(), first_line):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            if not isinstance(doc, dict):
                raise ValueError("a record is a JSON object")
            if "dump_stats" in doc:  # v4.3: the context of the records that follow
                context = {"header": doc["header"], "metadata": doc["metadata"]}
                continue
            if "coll_perf" not in doc:
                continue  # p2p_perf, proxy_trace: not collectives
            full = {**context, **doc} if "header" not in doc else doc
            out.records.append(_json_record(full, job_id))
        except (ValueError, KeyError, TypeError) as exc:
            why = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            out.errors.append(f"line {i}: {why}")
    return out


def _json_record(doc: dict[str, object], job_id: str) -> CollRecord:
    header, meta, perf = doc["header"], doc.get("metadata", {}), doc["coll_perf"]
    assert isinstance(header, dict) and isinstance(meta, dict) and isinstance(perf, dict)
    return CollRecord(
        job_id=job_id,
        comm=str(header["id"]),
        rank=int(header["rank"]),
        n_ranks=int(header.get("n_ranks", 0)),
        host=str(meta.get("hostname", "")),
        coll=str(perf["coll"]),
        seq=int(perf.get("coll_sn", 0)),
        message_size_bytes=float(perf["coll_msg_size_bytes"]),
        exec_time_seconds=float(perf["coll_exec_time_us"]) / 1e6,
        busbw_bytes_per_second=float(perf["coll_busbw_gbs"]) * GB,
        algbw_bytes_per_second=float(perf["coll_algobw_gbs"]) * GB,
        n_nodes=int(header.get("nnodes", 0)),
    )
