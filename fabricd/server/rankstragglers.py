"""Rank stragglers at the central: NCCL Inspector times in, ``straggler`` incidents out.

Wraps the app's detector, as the job attribution does (``jobattribution.py``): the inner
detector's incidents pass through, and ranks that ``fabricd.detect.ranks`` judges slow become
one incident each, on the rank's node, keyed by job, communicator, collective and rank, resolved
when the rank is back within its peers. Event time throughout.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fabricd.detect.ranks import RankStragglers, RankTime, SlowRank
from fabricd.detect.settle import SettlementState
from fabricd.model import Evidence, Incident, IncidentKind, IncidentState, Inputs, Sample, Severity, labels_of
from fabricd.scrape_rows import ScrapeRows
from fabricd.server.detection import Detector
from fabricd.server.store.records import Delivery

SOURCE = "inspector"
EXEC_TIME = "exec_time_seconds"  # a rank's time in one collective (collectors/inspector.py)
SIGNAL = "rank_exec_time_ratio"


def _may_time(samples: Sequence[Sample]) -> bool:
    """Whether ``samples`` may hold Inspector times: a stored scrape is iterated (which builds its
    samples, what the detection loop's reading as rows saves: ``fabricd.scrape_rows``) only if it
    has series of that source."""
    return not isinstance(samples, ScrapeRows) or SOURCE in samples.layout.sources


class RankStragglerDetector:
    def __init__(self, inner: Detector, ranks: RankStragglers | None = None) -> None:
        self.inner, self.ranks = inner, ranks or RankStragglers()
        self.open: dict[tuple[str, str, str, str], Incident] = {}

    def expect(self, nodes: Iterable[str], now: float) -> None:
        self.inner.expect(nodes, now)

    def settled(self) -> float | None:
        return self.inner.settled()

    def settlement(self) -> SettlementState:
        return self.inner.settlement()

    def adopt(self, incidents: Sequence[Incident]) -> list[Incident]:
        adopt = getattr(self.inner, "adopt", None)
        return list(adopt(incidents)) if adopt is not None else []

    def incidents(self) -> list[Incident]:
        current = getattr(self.inner, "incidents", None)
        return [*(current() if current is not None else []), *self.open.values()]

    @property
    def rates_only(self) -> bool:
        """The inner detector's (``detection.keep_for``): the Inspector's times are gauges, whose
        values a rates-only read still carries."""
        return bool(getattr(self.inner, "rates_only", False))

    def inputs(self) -> Inputs | None:
        """The inner detector's inputs and the Inspector's execution times (None: everything)."""
        inner = getattr(self.inner, "inputs", None)
        wanted: Inputs | None = inner() if inner is not None else None
        if wanted is None:
            return None
        return {**wanted, SOURCE: {*wanted.get(SOURCE, ()), EXEC_TIME}}

    def deliver(self, deliveries: Sequence[Delivery], now: float, partial: frozenset[str]) -> list[Incident]:
        """The inner detector settles its share; Inspector dumps are judged as they arrive (each
        dump holds every rank of a communicator at once: there is nothing to wait for)."""
        out = self.inner.deliver(deliveries, now, partial)
        return out + self._ranks([(d.node, s) for d in deliveries if _may_time(d.samples) for s in d.samples])

    def _ranks(self, samples: Sequence[tuple[str, Sample]]) -> list[Incident]:
        out: list[Incident] = []
        now = None
        for node, s in samples:
            r = s.reading
            if r.source == SOURCE and r.counter == EXEC_TIME:
                labels = dict(r.labels)
                t = RankTime(
                    labels.get("job_id", ""),
                    labels.get("comm", ""),
                    r.device,
                    labels.get("rank", ""),
                    node,
                    s.ts,
                    r.value,
                )
                self.ranks.observe(t)
                now = s.ts if now is None else max(now, s.ts)
        if now is None:
            return out
        for slow in self.ranks.judge():
            out.append(self._opened(slow))
        still = self.ranks.slow()
        for key in [k for k in self.open if k not in still]:
            out.append(self._resolved(self.open.pop(key), now))
        return out

    def _opened(self, slow: SlowRank) -> Incident:
        key = (slow.job_id, slow.comm, slow.coll, slow.rank)
        known = self.open.get(key)
        threshold = self.ranks.ratio
        ev = Evidence(
            SIGNAL,
            slow.node,
            slow.coll,
            "",
            round(slow.ratio, 3),
            threshold,
            slow.ts,
            labels_of({"job_id": slow.job_id, "comm": slow.comm, "rank": slow.rank}),
            f"{slow.seconds * 1e3:.3f} ms against the peers' median {slow.peers_median_seconds * 1e3:.3f} ms",
        )
        inc = Incident(
            key=f"straggler:rank:{slow.job_id}:{slow.comm}:{slow.coll}:{slow.rank}",
            kind=IncidentKind.STRAGGLER,
            severity=Severity.WARNING,
            state=IncidentState.OPEN,
            element=slow.node,
            summary=f"rank {slow.rank} of job {slow.job_id} is {slow.ratio:.1f}x slower than its peers in "
            f"{slow.coll} (communicator {slow.comm})",
            started_ts=known.started_ts if known else slow.ts,
            updated_ts=slow.ts,
            affected=[slow.node],
            evidence=[ev],
        )
        self.open[key] = inc
        return inc

    def _resolved(self, inc: Incident, now: float) -> Incident:
        inc.state, inc.resolved_ts, inc.updated_ts = IncidentState.RESOLVED, now, now
        return inc
