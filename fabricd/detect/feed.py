"""The one detection path: deliveries -> settlement -> the engine, moment by moment.

The central's ``DetectionLoop`` and ``fabricd eval``'s replay both feed the engine through a
``Detection``; the engine never knows which of the two it runs in (issue 15: "one detection path").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from fabricd.detect.engine import DetectionEngine
from fabricd.detect.settle import Moment, SettlementState, Settler, stamps_of
from fabricd.model import Incident, Sample, reads


@dataclass
class Detection:
    engine: DetectionEngine
    settler: Settler = field(default_factory=Settler)
    moments: int = 0
    _inputs: dict[str, frozenset[str]] | None = field(default=None, init=False, repr=False)  # engine.inputs(), once

    def expect(self, nodes: Iterable[str], now: float) -> None:
        self.settler.expect(nodes, now)

    def offer(self, node: str, samples: Sequence[Sample], now: float, stamps: Sequence[float] | None = None) -> None:
        self.settler.offer(node, samples, now, stamps)

    def offer_scrape(self, node: str, samples: Sequence[Sample], now: float) -> None:
        """A node's samples as an agent sent them: only the engine's inputs go on, as the central's
        detection loop reads them (``fabricd.server.store.records.Keep``), with the scrapes' times."""
        if self._inputs is None:
            self._inputs = self.engine.inputs()
        inputs = self._inputs
        self.settler.offer(node, [s for s in samples if reads(inputs, s.reading)], now, stamps_of(samples))

    def tick(self, now: float, partial: Collection[str] = ()) -> list[Incident]:
        """Evaluate every moment settled at processing time ``now`` (``partial``: ``Settler.tick``)."""
        return self._run(self.settler.tick(now, partial))

    def flush(self) -> list[Incident]:
        """Evaluate what is still held, whatever is missing (end of a replay, shutdown)."""
        return self._run(self.settler.drain())

    def settlement(self) -> SettlementState:
        return self.settler.state()

    def _run(self, moments: list[Moment]) -> list[Incident]:
        changed: list[Incident] = []  # every version in order: a sink sees each transition
        for moment in moments:
            self.moments += 1
            changed.extend(self.engine.process_scrapes(moment.scrapes, moment.ts, moment.left_out))
        return changed
