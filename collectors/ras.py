"""NCCL RAS collector: the running job's communicator health from its RAS thread. Off unless configured.

``fabricd/ras.py`` has the protocol and why this is guarded: polling RAS has crashed jobs on some
NCCL versions. So the jobs' NCCL version must be given (``nccl_version``) and is refused at load
when it is one of those or older than 2.28.3; the report's own version line is checked at every
poll, and a job on another version stops the polling (logged once); polls are at least
``interval_seconds`` (default 300, at least 60) apart. Each poll reports, per communicator group,
the ranks in it with its status and error state, and the count of lines in the Errors and
Warnings sections; nothing when no NCCL job listens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field, field_validator

from fabricd.collector import CollectorContext, CollectorFactories, CollectorOptions
from fabricd.model import Kind, Reading, labels_of
from fabricd.parsers.ras import RasReport, parse_status
from fabricd.ras import ask_status, check_version

log = logging.getLogger("fabricd.collectors.ras")
SOURCE = "ras"


class RasOptions(CollectorOptions):
    nccl_version: str  # of the jobs on this node: polling is refused on versions known to crash
    host: str = "localhost"
    port: int = Field(default=28028, ge=1, le=65535)
    interval_seconds: float = Field(default=300.0, ge=60)
    timeout_seconds: float = Field(default=10.0, gt=0)

    @field_validator("nccl_version")
    @classmethod
    def _safe(cls, value: str) -> str:
        return check_version(value)


@dataclass(frozen=True, slots=True)
class RasFactories(CollectorFactories):
    monotonic: Callable[[], float] = time.monotonic


def report_readings(report: RasReport) -> list[Reading]:
    out = [
        Reading(
            SOURCE,
            str(g.group),
            "",
            "group_ranks",
            float(g.ranks),
            "",
            Kind.GAUGE,
            labels_of({"status": g.status, "errors": g.errors}),
            "group_ranks",
            0,
        )
        for g in report.groups
    ]
    for name, lines in (("errors_reported", report.errors), ("warnings_reported", report.warnings)):
        out.append(Reading(SOURCE, "", "", name, float(len(lines)), "", Kind.GAUGE, (), name, 0))
    return out


class RasCollector:
    name: ClassVar[str] = "ras"
    Options: ClassVar[type[CollectorOptions]] = RasOptions

    def __init__(self, ctx: CollectorContext) -> None:
        assert isinstance(ctx.options, RasOptions)
        self.options = ctx.options
        self.monotonic = ctx.factories_for(RasFactories).monotonic
        self.next_poll = 0.0
        self.stopped = ""  # why polling stopped for good

    async def collect(self) -> Sequence[Reading]:
        if self.stopped or self.monotonic() < self.next_poll:
            return []
        self.next_poll = self.monotonic() + self.options.interval_seconds
        o = self.options
        try:
            report = parse_status(await ask_status(o.host, o.port, o.timeout_seconds))
        except (OSError, TimeoutError, ValueError) as exc:
            log.debug("no NCCL RAS answer at %s:%s: %s", o.host, o.port, exc)
            return []
        if report.version != o.nccl_version:
            self.stopped = f"the job runs NCCL {report.version or '(unknown)'}, not the configured {o.nccl_version}"
            log.warning("RAS polling stopped: %s; set collectors.ras.nccl_version after checking it", self.stopped)
            return []
        return report_readings(report)
