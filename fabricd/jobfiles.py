"""What the agent reads about jobs, parsed: prolog files, ``scontrol listpids``, Slurm host lists.

Pure functions of text; the ``jobs`` collector (``collectors/jobs.py``) does the reading. The job
file is what ``deploy/slurm/prolog.sh`` writes (docs/jobs.md); ``scontrol listpids`` prints
``PID JOBID STEPID LOCALID GLOBALID`` rows (https://slurm.schedmd.com/scontrol.html).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

MAX_TEXT = 128  # user and job names become label values: bounded
MAX_GPUS = 64
_JOB_ID = re.compile(r"[0-9]+(_[0-9]+)?(\+[0-9]+)?")  # 1234, array 1234_7, heterogeneous 1234+1
_RANGE = re.compile(r"([^\[,]*)\[([^\]]+)\]([^,]*)")


class JobFileError(ValueError):
    """A job file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job running on this node, as the scheduler told it (GPU indices on this node)."""

    job_id: str
    scheduler: str
    user: str = ""
    name: str = ""
    nodes: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()
    # Kubernetes: the pod that holds the devices, and the RDMA/SR-IOV devices it was given.
    namespace: str = ""
    pod: str = ""
    devices: tuple[str, ...] = field(default=())


def _text(doc: dict[str, object], key: str, where: str) -> str:
    value = doc.get(key, "")
    if not isinstance(value, str):
        raise JobFileError(f"{where}: {key} must be a string, not {type(value).__name__}")
    return value[:MAX_TEXT]


def parse_gpus(text: str, where: str = "gpus") -> tuple[int, ...]:
    """``SLURM_JOB_GPUS`` as Slurm writes it: ``0,1,2`` (ranges ``0-3`` accepted too)."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise JobFileError(f"{where}: {part!r} is not a GPU index (Slurm writes 0,1,2)")
        out.extend(range(int(lo), int(hi or lo) + 1))
    if len(out) > MAX_GPUS:
        raise JobFileError(f"{where}: {len(out)} GPUs, over {MAX_GPUS}")
    return tuple(sorted(set(out)))


def expand_hostlist(text: str) -> tuple[str, ...]:
    """A Slurm host list (``node[01-03,07],gpu-a``) as names, in order; zero padding kept."""
    names: list[str] = []
    for chunk in _split_top(text):
        m = _RANGE.fullmatch(chunk)
        if m is None:
            names.append(chunk)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise JobFileError(f"nodelist: {part!r} in {chunk!r} is not a number or a range")
            for n in range(int(lo), int(hi or lo) + 1):
                names.append(f"{prefix}{n:0{len(lo)}d}{suffix}")
    return tuple(names)


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_job_file(text: str, where: str) -> JobRecord:
    """One ``<jobid>.json`` as ``deploy/slurm/prolog.sh`` writes it; JobFileError names what is wrong."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JobFileError(f"{where}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
    if not isinstance(doc, dict):
        raise JobFileError(f"{where}: a JSON object was expected, not {type(doc).__name__}")
    job_id = _text(doc, "job_id", where)
    if not _JOB_ID.fullmatch(job_id):
        raise JobFileError(f"{where}: job_id {job_id!r} is not a Slurm job id")
    return JobRecord(
        job_id=job_id,
        scheduler=_text(doc, "scheduler", where) or "slurm",
        user=_text(doc, "user", where),
        name=_text(doc, "name", where),
        nodes=expand_hostlist(_text(doc, "nodelist", where)),
        gpus=parse_gpus(_text(doc, "gpus", where), f"{where}: gpus"),
    )


def parse_listpids(text: str) -> dict[str, set[int]]:
    """``scontrol listpids`` output: job id -> the pids slurmd tracks for it (header skipped)."""
    jobs: dict[str, set[int]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) < 2 or not words[0].isdigit() or not words[1].isdigit():
            continue  # the header, or a message such as "No jobs found"
        jobs.setdefault(words[1], set()).add(int(words[0]))
    return jobs
