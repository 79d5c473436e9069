"""What the transport does when the central does not read a batch's wire version (a rolling upgrade).

Never drop, never quarantine (docs/wire-format.md "Versions"). When the central does not read the
version this agent writes, the link is treated as down: everything spools and is retried with
backoff until the central is upgraded. When it reads ours but not an old spooled batch's (an agent
upgraded across two releases with a backlog), that batch is ``Parked``: the drain skips it for
``PARKED_RETRY_SECONDS`` so the batches behind it flow, and tries it again after.
"""

from __future__ import annotations

import logging

from fabricd import logs
from fabricd.transport.link import Grant, Link
from fabricd.transport.sender import SendResult

log = logging.getLogger("fabricd.transport")
PARKED_RETRY_SECONDS = 600.0


def ours_is_read(result: SendResult, wire_version: int) -> bool:
    """The central refused this batch's version but reads the one this agent writes."""
    return result.unsupported_version and wire_version in result.supported_versions


def outage_message(result: SendResult, wire_version: int) -> str:
    if not result.unsupported_version:
        return "central unreachable; spooling batches"
    return (
        f"central does not read wire version {wire_version}; spooling batches until it is upgraded"
        f" (or set transport.wire_version to one of {list(result.supported_versions)})"
    )


class Parked:
    """Spool keys set aside until a monotonic time; pure (the caller passes the time in)."""

    def __init__(self, retry_seconds: float = PARKED_RETRY_SECONDS) -> None:
        self.retry_seconds = retry_seconds
        self._until: dict[int, float] = {}

    def add(self, key: int, now: float) -> None:
        self._until[key] = now + self.retry_seconds

    def discard(self, key: int) -> None:
        self._until.pop(key, None)

    def keys(self, now: float) -> list[int]:
        """The keys still parked; those whose time has come are released for another try."""
        self._until = {k: t for k, t in self._until.items() if t > now}
        return list(self._until)

    def wait_seconds(self, now: float) -> float | None:
        """Seconds until the next key is released; None when nothing is parked."""
        return max(0.0, min(self._until.values()) - now) if self._until else None


def park(parked: Parked, link: Link, grant: Grant, key: int, now: float, result: SendResult) -> None:
    """Set a spooled batch aside: the central answered (so it is up) but does not read its version."""
    parked.add(key, now)
    if grant is Grant.PROBE:
        link.succeeded()
    what = "central does not read this spooled batch's wire version; kept in the spool, retried later"
    logs.event(log, logging.WARNING, what, spool_key=key, reason=result.reason, retry_in_seconds=parked.retry_seconds)
