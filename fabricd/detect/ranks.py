"""Rank stragglers: a rank whose collectives take longer than its peers' in the same communicator.

Input is NCCL Inspector's per-rank execution time (``collectors/inspector.py``). Every rank of a
communicator runs the same collective, so within one (job, communicator, collective) the ranks'
times are comparable; a rank is slow when its time exceeds ``ratio`` x the median of the other
ranks, on at least ``min_ranks`` ranks seen within ``window_seconds`` of the newest, for
``sustain`` judgements in a row (one slow dump is noise: a preempted host thread, a page fault).
A judgement happens when a new time for the group arrives. Event time only.

Caveat: a rank that arrives late at a collective makes the others wait, so their kernels take
longer and its own shortest; what Inspector times is the rank's own kernel. A slow rank here is
one whose own transfers are slow (its NIC, its PCIe path, its host), not one that is late.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

GroupKey = tuple[str, str, str]  # job, communicator, collective
FORGET_WINDOWS = 10


@dataclass(frozen=True, slots=True)
class RankTime:
    job_id: str
    comm: str
    coll: str
    rank: str
    node: str
    ts: float
    seconds: float


@dataclass(frozen=True, slots=True)
class SlowRank:
    job_id: str
    comm: str
    coll: str
    rank: str
    node: str
    ts: float
    seconds: float
    peers_median_seconds: float

    @property
    def ratio(self) -> float:
        return self.seconds / self.peers_median_seconds if self.peers_median_seconds > 0 else float("inf")


@dataclass(slots=True)
class _Group:
    latest: dict[str, RankTime] = field(default_factory=dict)
    streak: dict[str, int] = field(default_factory=dict)
    judged_ts: dict[str, float] = field(default_factory=dict)  # a rank's time counts once in its streak


class RankStragglers:
    def __init__(self, ratio: float = 1.5, min_ranks: int = 3, sustain: int = 2, window_seconds: float = 120.0) -> None:
        self.ratio, self.min_ranks, self.sustain, self.window = ratio, min_ranks, sustain, window_seconds
        self.groups: dict[GroupKey, _Group] = {}
        self._touched: set[GroupKey] = set()

    def observe(self, t: RankTime) -> None:
        key = (t.job_id, t.comm, t.coll)
        group = self.groups.setdefault(key, _Group())
        old = group.latest.get(t.rank)
        if old is None or t.ts >= old.ts:
            group.latest[t.rank] = t
            self._touched.add(key)

    def judge(self) -> list[SlowRank]:
        """Judge the groups that got new times since the last call; the ranks slow for ``sustain`` in a row.

        Groups silent for ``FORGET_WINDOWS`` windows since the newest time seen are forgotten (the
        job ended, the communicator was destroyed): their ranks are no longer slow."""
        out = []
        for key in sorted(self._touched):
            out.extend(self._judge(self.groups[key]))
        self._touched.clear()
        newest = max((t.ts for g in self.groups.values() for t in g.latest.values()), default=0.0)
        horizon = newest - FORGET_WINDOWS * self.window
        for key in [k for k, g in self.groups.items() if max(t.ts for t in g.latest.values()) < horizon]:
            del self.groups[key]
        return out

    def slow(self) -> set[tuple[str, str, str, str]]:
        """(job, comm, coll, rank) of every rank currently judged slow."""
        return {(*k, r) for k, g in self.groups.items() for r, n in g.streak.items() if n >= self.sustain}

    def _judge(self, group: _Group) -> list[SlowRank]:
        newest = max(t.ts for t in group.latest.values())
        fresh = {r: t for r, t in group.latest.items() if t.ts >= newest - self.window}
        out = []
        for rank, t in sorted(fresh.items()):
            peers = [p.seconds for r, p in fresh.items() if r != rank]
            if len(peers) + 1 < self.min_ranks:
                group.streak[rank] = 0
                continue
            mid = median(peers)
            if group.judged_ts.get(rank) != t.ts:
                group.judged_ts[rank] = t.ts
                group.streak[rank] = group.streak.get(rank, 0) + 1 if t.seconds > self.ratio * mid else 0
            if group.streak[rank] >= self.sustain:
                out.append(SlowRank(t.job_id, t.comm, t.coll, rank, t.node, t.ts, t.seconds, mid))
        return out
