"""Group samples into batches bounded by size (samples) and by age (seconds).

Pure: the caller passes the monotonic time in, so tests drive it without sleeping. A batch is
closed as soon as it holds ``max_samples`` samples, or when its first sample has waited
``max_seconds`` (the caller polls ``due``), so telemetry is never held longer than that bound.
Each batch carries the agent process's ``instance`` id and its ``seq`` (1, 2, 3, ... in creation
order) so the central can tell a hole from a batch that is merely late (docs/wire-format.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from fabricd.model import Batch, CollectorHealth, Sample
from fabricd.wire import event_time_range


def new_batch_id() -> str:
    # uuid4: unique across agents and restarts without coordination (the central dedupes on it).
    return uuid.uuid4().hex


class Batcher:
    def __init__(
        self,
        node: str,
        agent_version: str,
        max_samples: int,
        max_seconds: float,
        wall_clock: Callable[[], float],
        id_factory: Callable[[], str] = new_batch_id,
        instance: str | None = None,
    ) -> None:
        self.node = node
        self.agent_version = agent_version
        self.max_samples = max_samples
        self.max_seconds = max_seconds
        self._wall_clock = wall_clock
        self._new_id = id_factory
        self.instance = instance or new_batch_id()  # this agent process, for the batches' seq
        self.seq = 0  # the last batch's
        self._samples: list[Sample] = []
        self._health: list[CollectorHealth] = []
        self._opened_at: float | None = None

    @property
    def pending(self) -> int:
        return len(self._samples)

    def add(self, samples: Sequence[Sample], health: Sequence[CollectorHealth], now: float) -> list[Batch]:
        """Add one scrape's output; return the batches that became full (possibly none)."""
        full: list[Batch] = []
        if self._samples and len(self._samples) + len(samples) > self.max_samples:
            # A batch holds whole scrapes where it can: the central settles a node's event time by
            # its last delivered scrape (fabricd.detect.settle), and half a scrape would be evaluated
            # as if it were all of it. Only a scrape larger than a batch is split.
            full.append(self._close())
        if self._opened_at is None and (samples or health):
            self._opened_at = now
        self._health.extend(health)
        for sample in samples:
            self._samples.append(sample)
            if len(self._samples) >= self.max_samples:
                full.append(self._close())
                self._opened_at = now
        if self._opened_at is not None and not self._samples and not self._health:
            self._opened_at = None
        return full

    def due(self, now: float) -> bool:
        """True when the open batch has waited ``max_seconds`` and should be sent."""
        return self._opened_at is not None and now - self._opened_at >= self.max_seconds

    def deadline(self) -> float | None:
        """Monotonic time at which the open batch becomes due (None when nothing is pending)."""
        return None if self._opened_at is None else self._opened_at + self.max_seconds

    def flush(self) -> Batch | None:
        """Close the open batch whatever its size (timer, shutdown)."""
        if self._opened_at is None:
            return None
        return self._close()

    def _close(self) -> Batch:
        self.seq += 1
        first_ts, last_ts = event_time_range(self._samples)
        batch = Batch(
            node=self.node,
            agent_version=self.agent_version,
            batch_id=self._new_id(),
            samples=self._samples,
            health=self._health,
            created_ts=self._wall_clock(),
            instance=self.instance,
            seq=self.seq,
            first_ts=first_ts,
            last_ts=last_ts,
        )
        self._samples, self._health, self._opened_at = [], [], None
        return batch
