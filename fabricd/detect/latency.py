"""Tail latency: robust baselines for pingmesh p99 RTT and NCCL-tests times, and stragglers.

Baselines (median and MAD, robust to the very outliers they must expose):

* per series (a probe pair, a node's op and message size): the median and MAD of the last
  ``history`` values that were not themselves outliers (a fault does not become the new normal);
* across the fleet: the median and MAD of the latest value of every series of the same group
  (all probe pairs; all nodes for one op and size), so a fault present from the first scrape,
  before any series has history, is still an outlier against its peers.

The score is ``(value - median) / scale`` with ``scale = max(1.4826 x MAD, rel_floor x median,
abs_floor)``: 1.4826 x MAD estimates one standard deviation for normal noise, and the floors
stop a perfectly flat baseline (a simulator, an idle link) from turning a 1 % wiggle into a huge
score. The series score is used once the series has ``min_history`` values, the fleet score
before that; the fleet score is also required for NCCL (a collective is slow for everyone in it).

Straggler: a node whose NCCL times are outliers against the fleet, or whose NCCL-tests efficiency
(measured / model busbw) stayed low for several runs, while none of its ports has a
network finding is a node problem (a slow GPU, a throttled host), reported as ``straggler`` with
the node as the element (``engine`` checks the "network counters clean" part).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from statistics import median

from fabricd.detect import sides
from fabricd.detect.base import EvalContext, proposal
from fabricd.detect.findings import Finding
from fabricd.detect.incidents import Proposal
from fabricd.detect.network import Evidence3, PairGuard, cluster_network
from fabricd.model import Candidate, IncidentKind

MAD_TO_SIGMA = 1.4826  # MAD x 1.4826 estimates the standard deviation of normal data
MAX_STRAGGLERS = 2  # more nodes slow at once than this: a shared (network) cause
ANY_ELEMENT = frozenset({"fabric_link", "host_link", "hca", "switch", "node"})
NETWORK_HOLD_SECONDS = 0.0  # while a network fault is reported, a straggler must stay slow this long
# A node is slow in its collectives when its NCCL times are outliers against the fleet, or when its
# runs reach a small fraction of what the performance model predicts (fabricd.perfmodel).
SLOW_SIGNALS = ("nccl_time_outlier", "nccl_efficiency_sustained")
SLOW_KINDS = (IncidentKind.STRAGGLER, IncidentKind.TAIL_LATENCY)


@dataclass(frozen=True, slots=True)
class BaselineParams:
    history: int = 30  # values kept per series
    min_history: int = 6  # values before the series' own baseline is trusted
    refresh_every: int = 5  # recompute a series' median/MAD every this many accepted values
    rel_floor: float = 0.1  # scale >= 10 % of the median
    abs_floor: float = 0.0  # scale >= this, in the signal's unit
    exclude_above: float = 3.0  # values scoring above this do not enter the baseline
    # whether a series without history of its own is judged by the fleet's (NCCL: a slow node is
    # slow against its peers); pair RTTs differ by path by design, so a pair's own start is trusted
    fleet_gate: bool = True


@dataclass(slots=True)
class _Series:
    values: deque[float]
    med: float = 0.0
    scale: float = 0.0
    since_refresh: int = 0
    ready: bool = False


# The fleet a run is judged against is each member's median of its last runs, not its latest run:
# a straggler's partner is slow in their run together (a collective is as slow as its slowest
# member), so on a small fleet half the latest runs were slow at once and their median with them. A
# 4-node random variant scored its straggler 9 on its first slow run and 0.7 on the next, when its
# partner's slow run had joined the fleet; only the efficiency rule, three runs later, reported it,
# a second late. A healthy node paired once with a slow one is slow in one run of its last five;
# a fleet-wide change (a new job, a shared slowdown) moves every member's median within three runs.
FLEET_RUNS = 5


@dataclass(slots=True)
class _Fleet:
    recent: dict[tuple[str, ...], deque[float]] = field(default_factory=dict)
    med: float = 0.0
    scale: float = 0.0
    ts: float = float("-inf")  # event time the fleet statistics were computed at


class Baselines:
    """Scores values of many series against their own history and against their group's fleet."""

    def __init__(self, params: BaselineParams, round_seconds: float = 0.5) -> None:
        self.p = params
        self.round = round_seconds  # fleet statistics are recomputed at most once per scrape round
        self._series: dict[tuple[str, ...], _Series] = {}
        self._fleets: dict[tuple[str, ...], _Fleet] = {}

    def score(self, group: tuple[str, ...], key: tuple[str, ...], ts: float, value: float) -> tuple[float, float]:
        """(series score, fleet score) of ``value``; the series score is the fleet's until it has history."""
        fleet_score = 0.0
        if self.p.fleet_gate:  # otherwise the fleet's statistics are never used: not kept
            fleet = self._fleet(group, ts)
            runs = fleet.recent.get(key)
            if runs is None:
                runs = fleet.recent[key] = deque(maxlen=FLEET_RUNS)
            runs.append(value)
            fleet_score = self._z(value, fleet.med, fleet.scale) if len(fleet.recent) >= 3 else 0.0
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = _Series(deque(maxlen=self.p.history))
        own = self._z(value, s.med, s.scale) if s.ready else fleet_score
        if (own if s.ready or self.p.fleet_gate else 0.0) <= self.p.exclude_above:
            self._accept(s, value)
        return own, fleet_score

    def _accept(self, s: _Series, value: float) -> None:
        s.values.append(value)
        s.since_refresh += 1
        if len(s.values) >= self.p.min_history and (not s.ready or s.since_refresh >= self.p.refresh_every):
            s.med, s.scale = self._stats(list(s.values))
            s.since_refresh = 0
            s.ready = True

    def _fleet(self, group: tuple[str, ...], ts: float) -> _Fleet:
        fleet = self._fleets.get(group)
        if fleet is None:
            fleet = self._fleets[group] = _Fleet()
        if ts - fleet.ts > self.round and len(fleet.recent) >= 3:
            fleet.med, fleet.scale = self._stats([median(runs) for runs in fleet.recent.values()])
            fleet.ts = ts
        return fleet

    def _stats(self, values: list[float]) -> tuple[float, float]:
        med = median(values)
        mad = median([abs(v - med) for v in values])
        return med, max(MAD_TO_SIGMA * mad, self.p.rel_floor * abs(med), self.p.abs_floor, 1e-12)

    @staticmethod
    def _z(value: float, med: float, scale: float) -> float:
        return (value - med) / scale if scale > 0 else 0.0

    def series_median(self, key: tuple[str, ...]) -> float | None:
        s = self._series.get(key)
        return s.med if s is not None and s.ready else None


# --- proposals ------------------------------------------------------------------------------------


def propose(ctx: EvalContext) -> list[Proposal]:
    out = _tail(ctx)
    out.extend(_stragglers(ctx))
    return out


def _tail(ctx: EvalContext) -> list[Proposal]:
    pairs = ctx.of([IncidentKind.TAIL_LATENCY], ["rtt_p99_outlier"])
    if not pairs:
        return []
    # What reaches here was explained by no root cause before (pauses, loss, a queue on a link or
    # switch): slow pairs that consistently share an element (typically an end host answering
    # slowly). Pairs crossing an element with an open network incident are that incident's.
    # probers behind one leaf, slow wherever they probe beyond it, are no element's tail (sides.py)
    tail_min, tail_consistency = int(ctx.param("tail_min_pairs", 3)), ctx.param("tail_consistency", 0.75)
    guard = PairGuard(tail_min, tail_consistency, ANY_ELEMENT, probers_alone=partial(sides.one_sided, ctx))
    return cluster_network(
        ctx,
        IncidentKind.TAIL_LATENCY,
        Evidence3(pairs, [], []),
        "has tail latency above its baseline",
        absorb_strong=True,
        guard=guard,
        absorb_into=ctx.open_network_elements(),
        common_mode=True,
    )


def _stragglers(ctx: EvalContext) -> list[Proposal]:
    """A node slow in its collectives with clean network counters is a node problem.

    Two guards keep network victims out (a job is as slow as its slowest link, so a congested or
    paused link makes every job crossing it slow): when more than ``MAX_STRAGGLERS`` nodes are slow
    at once the cause is shared (the network), not a node; a node touched by an open network
    incident is not a straggler; and while a network fault is active a node must stay slow for
    ``NETWORK_HOLD_SECONDS`` (a victim is slow only while its job crosses the fault, and NCCL jobs
    move on; a straggler is slow in every job it joins).
    """
    slow = ctx.of([IncidentKind.STRAGGLER], SLOW_SIGNALS)
    ctx.claim(slow)
    by_node: dict[str, list[Finding]] = {}
    for f in slow:
        by_node.setdefault(f.node, []).append(f)
    if len(by_node) > ctx.param("straggler_max_nodes", MAX_STRAGGLERS):
        return []
    network = bool(ctx.blamed)  # a network root cause is being proposed right now
    faults = _fault_region(ctx)
    slow_nodes = set(by_node) | {f.node for f in ctx.pending_of([IncidentKind.STRAGGLER]) if f.signal in SLOW_SIGNALS}
    out = []
    for node, found in sorted(by_node.items()):
        held = ctx.now - min(f.started_ts for f in found)
        if _nodes_with_network_findings(ctx, node) or (
            network and held < ctx.param("straggler_network_hold", NETWORK_HOLD_SECONDS)
        ):
            continue
        if faults and _only_across(ctx, node, found, faults):
            continue
        if _slow_elsewhere(ctx, found, slow_nodes, faults) or _partners_slow_elsewhere(ctx, node, found):
            continue
        p = proposal(IncidentKind.STRAGGLER, node, None, found, "is a straggler (slow collectives, clean network)")
        p.candidates = [Candidate(node, 1.0, 1.0)]
        out.append(p)
    return out


PAUSING = (IncidentKind.HOL_BLOCKING, IncidentKind.PFC_STORM)


def _fault_region(ctx: EvalContext) -> set[str]:
    """Elements of open (or just proposed) network faults; a pausing root (HOL, PFC storm) stands
    for its whole leaf: every flow into that leaf is paused with it (DOMAIN.md)."""
    out = ctx.open_network_elements()
    pausing = {e for k in PAUSING for e in ctx.open_elements.get(k, ())}
    pausing |= {e for e, key in ctx.blamed.items() if key.split(":", 1)[0] in {k.value for k in PAUSING}}
    for element in pausing:
        leaf = ctx.localizer.leaf(element)
        if leaf is not None:
            out.add(leaf)
    return out


def _only_across(ctx: EvalContext, node: str, found: Sequence[Finding], faults: set[str]) -> bool:
    """No NCCL run of ``node`` since it turned slow was both slow and clear of every open network
    fault (no member pair whose traffic may cross one): it may be that fault's victim. A straggler
    is slow with every partner, so it is slow in a run that avoids the fault and is reported then;
    a victim is fast in such a run."""
    since = min(f.started_ts for f in found) - ctx.interval
    runs = [(ts, hosts) for ts, hosts in ctx.run_hosts.get(node, ()) if ts >= since]
    if not runs:
        return False  # who it ran with is unknown: the counters-clean rule above is all there is
    slow_at = min((f.rule.condition.threshold for f in found if f.signal == "nccl_time_outlier"), default=None)
    scores = ctx.run_scores.get(node, {})
    loc = ctx.localizer
    for ts, hosts in runs:
        clear = not any(loc.may_cross(a, b, faults) for a in hosts for b in hosts if a < b)
        if clear and (slow_at is None or scores.get(ts, 0.0) > slow_at):
            return False
    return True


def _slow_elsewhere(ctx: EvalContext, found: Sequence[Finding], slow_nodes: set[str], faults: set[str]) -> bool:
    """Whether, since ``found`` began (and two intervals before), some NCCL run was slow that no
    slow node took part in and no open network fault explains: then the slowness is shared.

    A straggler is slow with every partner, and each partner is slow only in its run with it: every
    slow run of the fleet has a slow node in it. A congested fabric link no probe pair shows slows
    every run across it: a random variant (12 nodes, 2 a leaf) opened three stragglers on the two
    leaves behind the link, each slow with two partners in a row across it, while other runs across
    it, none with a slow node, were slow too. Such a node waits until the runs it shares the
    slowness with leave the window (a hold, not a verdict: a straggler's partners move on)."""
    slow_at = min((f.rule.condition.threshold for f in found if f.signal == "nccl_time_outlier"), default=None)
    if slow_at is None:
        return False  # efficiency alone: no per-run scores to compare
    since = min(f.started_ts for f in found) - 2 * ctx.interval
    loc = ctx.localizer
    for other, runs in ctx.run_hosts.items():
        scores = ctx.run_scores.get(other, {})
        for ts, hosts in runs:
            if ts < since or scores.get(ts, 0.0) <= slow_at or hosts & slow_nodes:
                continue
            if faults and any(loc.may_cross(a, b, faults) for a in hosts for b in hosts if a < b):
                continue
            return True
    return False


def _partners_slow_elsewhere(ctx: EvalContext, node: str, found: Sequence[Finding]) -> bool:
    """Whether every slow NCCL run of ``node`` since it turned slow had a partner that was slow in a
    run without ``node`` too (within the runs remembered): the slowness is then that partner's, or
    what the partner's runs share, and not ``node``'s.

    A collective is as slow as its slowest member or link, so a straggler's partners are slow in
    their runs with it and only there. The nodes behind a leaf whose uplink is congested are slow
    with every partner across it and fast with each other, and a node that meets two of them in a
    row is slow twice: a random variant (12 nodes, two a leaf, four spines, one probed pair across
    the link) opened three stragglers so, one after the other, while the slow nodes behind the link
    kept the count of slow nodes at two, under ``MAX_STRAGGLERS``. Those two were fast in their
    run together, and each was slow without the other: a node fast with a partner that is slow
    elsewhere is not slowing every run it joins, whatever its other runs say. A hold, not a
    verdict: a straggler's first slow run with a partner that is slow nowhere else reports it."""
    outliers = [f.rule for f in found if f.signal == "nccl_time_outlier"]
    if not outliers:
        return False  # efficiency alone: no per-run scores to compare
    slow_at = min(r.condition.threshold for r in outliers)
    fast_below = min((r.clear or r.condition).threshold for r in outliers)  # the rule's clear level
    since = min(f.started_ts for f in found) - 2 * ctx.interval
    scores = ctx.run_scores.get(node, {})
    runs = ctx.run_hosts.get(node, ())
    if any(
        scores.get(ts, slow_at) < fast_below and any(_slow_without(ctx, p, node, slow_at) for p in hosts - {node})
        for ts, hosts in runs
    ):
        return True  # fast with a partner that is slow elsewhere: their slowness is what lies between
    slow_runs = [hosts for ts, hosts in runs if ts >= since and scores.get(ts, 0.0) > slow_at]
    return bool(slow_runs) and all(
        any(_slow_without(ctx, partner, node, slow_at) for partner in hosts - {node}) for hosts in slow_runs
    )


def _slow_without(ctx: EvalContext, partner: str, node: str, slow_at: float) -> bool:
    """Whether one of ``partner``'s remembered NCCL runs was slow without ``node`` in it."""
    scores = ctx.run_scores.get(partner, {})
    return any(node not in hosts and scores.get(ts, 0.0) > slow_at for ts, hosts in ctx.run_hosts.get(partner, ()))


def _nodes_with_network_findings(ctx: EvalContext, node: str) -> bool:
    """Whether ``node``'s own network is suspect. Where its NCCL runs name their hosts, a fault
    elsewhere is told apart by ``_only_across``, so only what is the node's own counts: network
    findings no incident explains (unclaimed) and incidents on its own ports or links. Otherwise,
    any network finding on it or an open network incident touching it (it may be a victim)."""
    loc = ctx.localizer
    # the host of each blamed port or host link, as the topology has it (not split from the id)
    own = {h for e in (*ctx.blamed, *ctx.open_network_elements()) if loc.kind(e) != "node" and (h := loc.node_of(e))}
    network = [f for f in ctx.findings if f.node == node and f.rule.kind not in SLOW_KINDS]
    if ctx.run_hosts.get(node):
        return node in own or any(id(f) not in ctx.claimed for f in network)
    blamed_hosts = {h for e in ctx.blamed if (h := loc.node_of(e))}
    return node in own or bool(network) or node in ctx.network_nodes or node in blamed_hosts
