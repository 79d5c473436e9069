"""What one node's scrape becomes: readings -> ``RateEngine`` -> derived signals -> samples.

The only place these two steps are joined. The agent (``fabricd.agent.agent.Agent``),
``fabricd collect`` and ``fabricd eval`` each keep one ``ScrapePipeline`` per node and call
``samples`` once per scrape, so what eval scores and what ``collect`` prints is what the agent ships.
"""

from __future__ import annotations

from collections.abc import Sequence

from fabricd.counters import RateEngine
from fabricd.derived import derive
from fabricd.model import Reading, Sample


class ScrapePipeline:
    """One node's rate state (rates need the previous scrape) and the step from readings to samples."""

    def __init__(self, engine: RateEngine | None = None) -> None:
        self.engine = engine if engine is not None else RateEngine()

    def samples(self, ts: float, readings: Sequence[Reading]) -> list[Sample]:
        """The scrape at event time ``ts``: its rated samples, then the signals derived from them."""
        samples = self.engine.update(ts, readings)
        samples.extend(derive(samples))
        return samples
