"""Minimal detectors for tests of what surrounds detection (the store, the job join, hooks).

``ImmediateDetector`` speaks the settlement loop's ``Detector`` protocol
(``fabricd.server.detection``) for a subclass that only implements ``process(samples)``: every
delivery is settled at once, as if each node had delivered everything up to its newest sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fabricd.detect.settle import SettlementState
from fabricd.model import Incident, Sample
from fabricd.server.store.records import Delivery


class ImmediateDetector:
    newest: float | None = None

    def process(self, samples: Sequence[tuple[str, Sample]]) -> list[Incident]:
        raise NotImplementedError

    def expect(self, nodes: Iterable[str], now: float) -> None:
        del nodes, now

    def deliver(self, deliveries: Sequence[Delivery], now: float, partial: frozenset[str]) -> list[Incident]:
        del now, partial
        samples = [(d.node, s) for d in deliveries for s in d.samples]
        self.newest = max([s.ts for _, s in samples], default=self.newest)
        return self.process(samples)

    def settled(self) -> float | None:
        return self.newest

    def settlement(self) -> SettlementState:
        return SettlementState(self.newest, 10.0, 0, (), 0, 0.0)
