"""Is the central service reachable, and when may the next probe go out?

While the central answers, every live batch is sent at once. After a failure the link is down:
batches go straight to the spool, and exactly one request at a time (a live batch or the oldest
spooled one, whichever comes first) probes the central once the backoff delay -- or the server's
Retry-After -- has passed. Pure: the caller passes monotonic time in.
"""

from __future__ import annotations

import math
from enum import Enum

from fabricd.transport.sender import Backoff


class Grant(Enum):
    """What ``claim`` allowed: a normal send while up, or the one probe while down."""

    SEND = "send"
    PROBE = "probe"


class Link:
    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff
        self.up = True  # optimistic at start: the first batch finds out
        self.retry_at = 0.0
        self.reason = ""

    def claim(self, now: float) -> Grant | None:
        """May a request go out now? None means: spool it (live) or wait (drain)."""
        if self.up:
            return Grant.SEND
        if now >= self.retry_at:
            self.retry_at = math.inf  # one probe in flight; the others keep spooling
            return Grant.PROBE
        return None

    def wait_seconds(self, now: float) -> float | None:
        """Seconds until the next probe may go; None while one is in flight (its answer wakes us)."""
        if self.up:
            return 0.0
        return None if math.isinf(self.retry_at) else max(0.0, self.retry_at - now)

    def succeeded(self) -> bool:
        """Record a 200; returns True when this ends an outage."""
        was_down = not self.up
        self.up, self.retry_at, self.reason = True, 0.0, ""
        self.backoff.reset()
        return was_down

    def failed(self, grant: Grant, now: float, reason: str, retry_after: float | None) -> bool:
        """Record a retryable failure; returns True when this starts an outage."""
        was_up = self.up
        if grant is Grant.SEND and not was_up:
            # another request already took the link down and set the schedule; only a longer
            # Retry-After from the server may push the next probe further out
            if retry_after is not None and math.isfinite(self.retry_at):
                self.retry_at = max(self.retry_at, now + retry_after)
            return False
        delay = retry_after if retry_after is not None else self.backoff.next_delay()
        self.up, self.retry_at, self.reason = False, now + delay, reason
        return was_up
