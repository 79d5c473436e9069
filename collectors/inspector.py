"""NCCL Inspector collector: the jobs' own per-rank collective time and bandwidth, from its dump folder.

Reads what the NCCL Inspector plugin writes under ``dir`` (``fabricd/inspector_parse.py``):
``nccl_inspector_metrics_*.prom`` files (re-read when rewritten) and JSON lines (``*.log``,
``*.jsonl``; followed from where the last scrape stopped, restarted when a file shrinks). Each
scrape reports the newest record per (job, communicator, rank, collective) that arrived since the
last one: ``exec_time_seconds``, ``busbw_bytes_per_second``, ``algbw_bytes_per_second`` and
``message_size_bytes``, and the communicator's ``communicator_ranks`` and ``communicator_nodes``, labelled ``job_id``, ``comm``, ``rank``. These are per-job series by
nature, bounded by the ranks on this node times their communicators; nothing else carries a job
label. Records that cannot be used are counted (``records_invalid``) and logged once per file.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from fabricd.collector import CollectorContext, CollectorOptions
from fabricd.inspector_parse import CollRecord, Parsed, job_of_folder, parse_jsonl, parse_prom
from fabricd.model import Kind, Reading, labels_of

log = logging.getLogger("fabricd.collectors.inspector")
SOURCE = "inspector"
MAX_FILES = 4096


class InspectorOptions(CollectorOptions):
    dir: Path
    job_id: str | None = Field(default=None, min_length=1, max_length=64)  # else from nccl-inspector-<id>
    max_bytes_per_scrape: int = Field(default=8 << 20, ge=4096)  # of JSON lines, over all files


def record_readings(rec: CollRecord) -> list[Reading]:
    labels = labels_of({"job_id": rec.job_id, "comm": rec.comm, "rank": str(rec.rank)})
    values = (
        ("exec_time_seconds", rec.exec_time_seconds, "seconds"),
        ("busbw_bytes_per_second", rec.busbw_bytes_per_second, "bytes_per_second"),
        ("algbw_bytes_per_second", rec.algbw_bytes_per_second, "bytes_per_second"),
        ("message_size_bytes", rec.message_size_bytes, "bytes"),
        ("communicator_ranks", float(rec.n_ranks), ""),
        ("communicator_nodes", float(rec.n_nodes), ""),
    )
    return [Reading(SOURCE, rec.coll, "", n, v, u, Kind.GAUGE, labels, n, 0) for n, v, u in values]


class InspectorCollector:
    name: ClassVar[str] = "inspector"
    Options: ClassVar[type[CollectorOptions]] = InspectorOptions

    def __init__(self, ctx: CollectorContext) -> None:
        assert isinstance(ctx.options, InspectorOptions)
        self.options = ctx.options
        self.offsets: dict[Path, int] = {}  # JSON lines: bytes consumed (a whole number of lines)
        self.lines: dict[Path, int] = {}
        self.mtimes: dict[Path, int] = {}  # Prometheus files: mtime_ns last read
        self.seen: dict[tuple[str, str, int, str], int] = {}  # newest coll_sn reported per key
        self.logged: set[Path] = set()
        self.invalid = 0

    async def collect(self) -> Sequence[Reading]:
        fresh: dict[tuple[str, str, int, str], CollRecord] = {}
        budget = self.options.max_bytes_per_scrape
        files = self._files()
        kept = set(files)  # a deleted file's place is forgotten (a dump folder per job comes and goes)
        self.offsets = {p: o for p, o in self.offsets.items() if p in kept}
        self.mtimes = {p: m for p, m in self.mtimes.items() if p in kept}
        for path in files:
            parsed, used = self._read(path, budget)
            budget -= used
            self._count(path, parsed)
            for rec in parsed.records:
                key = (rec.job_id, rec.comm, rec.rank, rec.coll)
                if rec.seq > self.seen.get(key, -1) and rec.seq >= getattr(fresh.get(key), "seq", -1):
                    fresh[key] = rec
        for key, rec in fresh.items():
            self.seen[key] = rec.seq
        out = [r for rec in fresh.values() for r in record_readings(rec)]
        out.append(
            Reading(SOURCE, "", "", "records_invalid", float(self.invalid), "", Kind.GAUGE, (), "records_invalid", 0)
        )
        return out

    def _files(self) -> list[Path]:
        root = self.options.dir
        if not root.is_dir():
            return []
        found = [p for pattern in ("*.prom", "*.log", "*.jsonl") for p in root.rglob(pattern) if p.is_file()]
        return sorted(found)[:MAX_FILES]

    def _read(self, path: Path, budget: int) -> tuple[Parsed, int]:
        try:
            if path.suffix == ".prom":
                mtime = path.stat().st_mtime_ns
                if self.mtimes.get(path) == mtime:
                    return Parsed(), 0
                self.mtimes[path] = mtime
                return parse_prom(path.read_text(errors="replace")), 0
            return self._tail(path, budget)
        except OSError as exc:
            return Parsed(errors=[f"cannot read: {exc.strerror or exc}"]), 0

    def _tail(self, path: Path, budget: int) -> tuple[Parsed, int]:
        size = path.stat().st_size
        start = self.offsets.get(path, 0)
        if size < start:  # rewritten (a new run in the same folder): from the start again
            start, self.lines[path] = 0, 0
        if budget <= 0 or size == start:
            return Parsed(), 0
        with path.open("rb") as f:
            f.seek(start)
            data = f.read(min(size - start, budget))
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next scrape
        self.offsets[path] = start + len(whole)
        first = self.lines.get(path, 0) + 1
        self.lines[path] = first - 1 + whole.count(b"\n")
        job = self.options.job_id or job_of_folder(path.parent.name)
        return parse_jsonl(whole.decode(errors="replace"), job, first), len(whole)

    def _count(self, path: Path, parsed: Parsed) -> None:
        self.invalid += len(parsed.errors)
        if parsed.errors and path not in self.logged:
            self.logged.add(path)
            log.warning("NCCL Inspector records skipped in %s: %s", path, "; ".join(parsed.errors[:3]))
