"""What every detector sees at one evaluation, and the helpers they share to build proposals."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fabricd import units
from fabricd.detect.findings import Finding
from fabricd.detect.incidents import Proposal, max_severity
from fabricd.detect.localize import Cluster, Localizer, Symptom
from fabricd.detect.roundtrip import DIRECTED, link_of
from fabricd.model import Candidate, Evidence, IncidentKind
from fabricd.signal_table import BY_NAME
from fabricd.topology import ElementKind

PAIR_SIGNALS = frozenset({"probe_loss_ratio", "rtt_p99_outlier", "rtt_queue_outlier"})
# What an ambiguous incident's summary asks for (docs/detection.md, "Partial knowledge")
NARROW_DOWN = "trace paths or run a pinned probe to narrow it down"


@dataclass(slots=True)
class EvalContext:
    now: float
    findings: list[Finding]
    localizer: Localizer
    hca_of: dict[tuple[str, str], str]  # (node, source device) -> HCA port id
    healthy_pairs: list[tuple[str, str]]  # every probe pair observed recently (bad ones included)
    claimed: set[int] = field(default_factory=set)  # id() of findings already explained
    # elements already blamed this evaluation (by any kind), with the incident key that owns them
    blamed: dict[str, str] = field(default_factory=dict)
    # elements of incidents still open from earlier evaluations, by kind (a flap between outages)
    open_elements: dict[IncidentKind, set[str]] = field(default_factory=dict)
    # nodes touched by open network incidents (their element or affected nodes/pairs)
    network_nodes: set[str] = field(default_factory=set)
    params: dict[str, float] = field(default_factory=dict)  # ``params:`` of the rule files
    rx_utilization: dict[str, float] = field(default_factory=dict)  # HCA port -> last rx / link rate
    # findings whose condition holds but whose ``for`` has not passed: they vote in localization
    # (nodes scrape at their own phase, so at any moment some have seen a new fault once, some
    # twice), but a cluster needs one firing finding to become a proposal
    pending: list[Finding] = field(default_factory=list)
    interval: float = 10.0  # the fleet's scrape interval (learned by the engine)
    run_hosts: dict[str, list[tuple[float, set[str]]]] = field(default_factory=dict)  # node -> NCCL runs' hosts
    run_scores: dict[str, dict[float, float]] = field(default_factory=dict)  # node -> run ts -> fleet score
    # probe pairs whose last queue score is in the rule's hysteresis band (over ``clear``, not over
    # the condition): neither slow nor healthy, so they count neither way where a queue is placed
    rtt_unsure: set[tuple[str, str]] = field(default_factory=set)
    # keys of open incidents whose own symptoms showed in this evaluation without a proposal of
    # theirs (an open fabric queue's receivers' marks): they are not quiet (IncidentBook.touch)
    active: set[str] = field(default_factory=set)

    def param(self, name: str, default: float) -> float:
        return self.params.get(name, default)

    def of(self, kinds: Iterable[IncidentKind], signals: Iterable[str] | None = None) -> list[Finding]:
        ks, sig = set(kinds), set(signals) if signals is not None else None
        return [
            f
            for f in self.findings
            if id(f) not in self.claimed and f.rule.kind in ks and (sig is None or f.signal in sig)
        ]

    def pending_of(self, kinds: Iterable[IncidentKind]) -> list[Finding]:
        ks = set(kinds)
        return [f for f in self.pending if f.rule.kind in ks]

    def signal(self, *signals: str) -> list[Finding]:
        wanted = set(signals)
        return [f for f in self.findings if id(f) not in self.claimed and f.signal in wanted]

    def claim(self, findings: Iterable[Finding]) -> None:
        self.claimed.update(id(f) for f in findings)

    def hca(self, f: Finding) -> str:
        return self.hca_of.get((f.node, f.device)) or self.localizer.hca(f.node, f.device)

    def healthy_symptoms(self, bad_pairs: set[tuple[str, str]], common_mode: bool = False) -> list[Symptom]:
        """The probe pairs not in ``bad_pairs``, as symptoms observed fine. ``common_mode``: the
        pairs' delays had their prober's common mode taken out (``fabricd.detect.delays``), so a
        pair is blind to the fabric elements every pair of its prober crosses (``blind_spots``)."""
        loc = self.localizer
        out = [loc.pair_symptom(p, p[0], p[1]) for p in self.healthy_pairs if p not in bad_pairs]
        spots = blind_spots(loc, self.healthy_pairs) if common_mode else {}
        return [_without(s, spots[s.ref[0]]) if s.ref[0] in spots else s for s in out]

    def pair_symptoms(self, findings: Sequence[Finding]) -> list[Symptom]:
        """The pairs' symptoms, each weighted by how far over its threshold it is against the
        others' (``severity_weights``)."""
        weights = severity_weights(findings)
        return [self.localizer.pair_symptom(f, f.node, f.device, w) for f, w in zip(findings, weights, strict=True)]

    def open_network_elements(self) -> set[str]:
        """Elements of open network incidents and of network root causes proposed so far."""
        out = set(self.blamed)
        for kind, elements in self.open_elements.items():
            if kind not in (IncidentKind.STRAGGLER, IncidentKind.TAIL_LATENCY):
                out |= elements
        return out

    def claim_touching(self, signals: Iterable[str], ports: Collection[str], pending: bool = False) -> list[Finding]:
        """Claim pair findings with an end on one of the HCA ``ports`` (in every path alternative),
        and per-node findings (NCCL) of those ports' nodes; ``pending``: those not firing yet too."""
        if not ports:
            return []
        hosts = {self.localizer.node_of(p) for p in ports}
        nodes = {h for h in hosts if h}
        wanted = set(signals)
        candidates = self.signal(*wanted)
        if pending:
            candidates += [f for f in self.pending if id(f) not in self.claimed and f.signal in wanted]
        found = []
        for f in candidates:
            if f.signal in PAIR_SIGNALS:
                used = self.localizer.pair_ports(f.node, f.device)
                if used and sum(share for port, share in used.items() if port in ports) >= 1.0 - 1e-9:
                    found.append(f)
            elif f.node in nodes:
                found.append(f)
        self.claim(found)
        return found


# How far over its threshold one finding can count, in decades: 1,000x over weighs 4x one just over.
SEVERITY_CAP = 1000.0
# Only a standing queue's delay: every pair through one queue waits about as long, so the pairs it
# delays stand orders of magnitude above the noise. A lost-probe ratio is a sample (a pair losing 3
# probes and one losing 1 cross the same lossy link): weighting it moved the shipped scenarios'
# localization (`mixed` opened a host link beside its lossy link, `large` lost precision).
SEVERITY_SIGNALS = frozenset({"rtt_queue_outlier"})


def severity_weights(findings: Sequence[Finding]) -> list[float]:
    """Each finding's weight in a vote: 1 + log10 of its value over its threshold (capped at
    ``SEVERITY_CAP``; 1 for signals outside ``SEVERITY_SIGNALS``), over the mean of them all, so
    the findings weigh as many as they are, shared by how strongly each says something is wrong.
    A pair 120 ms slow behind a queue (a score of thousands) is stronger evidence than one 6 robust
    sigmas above a noisy baseline: in the routed lab the software routers that forwarded the fault's
    traffic slowed a dozen unrelated pairs through the spine by some 100 us, which outvoted the
    queue's own link by count alone (the spine won, 0.52 to 0.50)."""
    if not findings:
        return []
    sev = [_severity(f) for f in findings]
    mean = sum(sev) / len(sev)
    return [s / mean for s in sev]


def _severity(f: Finding) -> float:
    if f.signal not in SEVERITY_SIGNALS:
        return 1.0
    return 1.0 + math.log10(min(SEVERITY_CAP, max(1.0, f.value / (f.rule.condition.threshold or 1.0))))


def evidence(f: Finding) -> Evidence:
    return Evidence(
        signal=f.signal,
        node=f.node,
        device=f.device,
        port=f.port,
        value=round(f.value, 6),
        threshold=f.rule.condition.threshold,
        ts=f.last_ts,
        labels=f.labels,
        note=f"rule {f.rule.name} ({f.rule.signal} {f.rule.condition}, for {f.rule.for_seconds:g}s)",
        op=f.rule.condition.op,
        unit=_unit(f.signal),
    )


def _unit(signal: str) -> str:
    found = BY_NAME.get(signal)
    return found.unit if found is not None else ""


def _quoted(top: Finding) -> str:
    """The top finding's value in its signal's unit. Guessing a ratio from the threshold (< 1)
    wrote 0.2 symbol errors a second as "20.0%"; a signal outside the table keeps that guess."""
    unit = _unit(top.signal)
    ratio = unit == "ratio" or (not unit and top.rule.condition.threshold < 1 and top.value <= 1)
    return f"{top.value:.1%}" if ratio else units.quantity(top.value, unit)


def affected_of(findings: Iterable[Finding]) -> list[str]:
    out: set[str] = set()
    for f in findings:
        out.add(f"{f.node}|{f.device}" if f.signal in PAIR_SIGNALS else f.node)
    return sorted(out)


def hhmm(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%H:%M")


def strongest(findings: Sequence[Finding]) -> Finding:
    """The finding furthest over its threshold (what the summary quotes)."""
    return max(findings, key=lambda f: f.value / (f.rule.condition.threshold or 1.0))


def proposal(
    kind: IncidentKind, element: str, cluster: Cluster | None, findings: Sequence[Finding], what: str
) -> Proposal:
    """A proposal with summary ``<element> <what> since HH:MM UTC, N affected, <top signal>``."""
    top = strongest(findings)
    started = min(f.started_ts for f in findings)
    pairs = sum(1 for f in findings if f.signal in PAIR_SIGNALS)
    nodes = len({f.node for f in findings})
    scope = f"{units.count(pairs, 'node pair') if pairs else units.count(nodes, 'node')} affected"
    value = _quoted(top)
    ambiguous = cluster is not None and cluster.ambiguous
    subject = cluster.subject if cluster is not None and ambiguous else element
    summary = f"{subject} {what} since {hhmm(started)} UTC, {scope}, {top.signal} at {value} on {top.node}"
    if ambiguous:
        summary += f"; {NARROW_DOWN}"
    evs = sorted((evidence(f) for f in findings), key=lambda e: -e.value / (e.threshold or 1.0))
    candidates = cluster.candidates if cluster is not None else []
    return Proposal(
        kind,
        element,
        list(candidates),
        affected_of(findings),
        evs,
        max_severity([f.severity for f in findings]),
        started,
        summary,
        # an ambiguous incident may be narrowed onto one of its candidates later (incidents.py)
        narrows_to=tuple(c.element for c in candidates) if ambiguous else (),
        ambiguous=ambiguous,
    )


def spread(ctx: EvalContext, findings: Sequence[Finding]) -> bool:
    """Symptoms on more than one port, all placed in the topology: flows from many places."""
    hcas = {ctx.hca(f) for f in findings if f.signal != "qdisc_backlog_bytes"}
    return len(hcas) > 1 and all(ctx.localizer.leaf(h) is not None for h in hcas)


def by_leaf(ctx: EvalContext, kind: IncidentKind, found: list[Finding], what: str) -> list[Proposal]:
    """Port symptoms of flows that crossed one fabric element, with no pair to say which: every such
    flow has one end behind the leaf the element hangs off, so that leaf holds the largest share of
    the symptoms (weighted by how far over threshold) and is blamed, its uplinks as candidates."""
    weight: dict[str, float] = {}
    for f in found:
        leaf = ctx.localizer.leaf(ctx.hca(f))
        if leaf is not None:
            weight[leaf] = weight.get(leaf, 0.0) + min(10.0, f.value / (f.rule.condition.threshold or 1.0))
    if not weight:
        return []
    total = sum(weight.values())
    ranked = sorted(weight.items(), key=lambda kv: (-kv[1], kv[0]))
    leaf, share = ranked[0][0], ranked[0][1] / total
    ctx.claim(found)
    uplinks = ctx.localizer.uplinks(leaf)
    if _ends_of_open(ctx, kind, {leaf, *uplinks}):
        return []
    p = proposal(kind, leaf, None, found, what)
    p.candidates = [Candidate(leaf, round(share, 4), round(share, 4))]
    p.candidates += [Candidate(u, round(share / len(uplinks), 4), round(share / len(uplinks), 4)) for u in uplinks]
    p.candidates += [Candidate(k, round(v / total, 4), round(v / total, 4)) for k, v in ranked[1:3]]
    p.candidates.sort(key=lambda c: (-c.score, c.element))  # best first, as the API promises
    p.narrows_to = tuple(uplinks)
    p.ambiguous = bool(uplinks)  # the leaf or one of its uplinks: no pair says which
    ctx.blamed.setdefault(leaf, p.key)
    return [p]


def _ends_of_open(ctx: EvalContext, kind: IncidentKind, place: set[str]) -> bool:
    """Port symptoms with no pair to say where, while an incident of this kind is open on a fabric
    link or switch that is not this leaf or one of its uplinks: the ends of flows that crossed the
    open fault (its receivers' marks, its flows' sequence errors), not a second fault. Pairs can be
    set aside for an evaluation (``probe_storm_share``: a loaded host's probes late at once), which
    leaves the marks alone; blamed by share, 16 receivers spread evenly over the leaves picked the
    first leaf by name beside the open uplink (tests/test_detect_congestion.py). A second fabric
    fault is still found by its own pairs; without any, it waits for the first to end
    (docs/detection.md, blind spots). A proposal on this leaf or its uplinks still confirms or
    narrows an open incident there (incidents.py)."""
    opened = ctx.open_elements.get(kind, set())
    if opened & place:
        return False
    fabric = (ElementKind.FABRIC_LINK, ElementKind.SWITCH)
    return any(ctx.localizer.kind(e) in fabric for e in opened)


def blind_spots(loc: Localizer, pairs: Iterable[tuple[str, str]]) -> dict[str, frozenset[str]]:
    """Per prober, the fabric links and remote switches that every one of its probed pairs crosses.

    The prober's common mode (what even its least-delayed pair got on top of its normal: its host's
    jitter) is taken out of each of its pairs' delays; a queue on an element all its pairs cross
    is taken out with it, so those pairs look clean and must not clear that element. A random
    variant (48 nodes, 8 a leaf, 2 spines, InfiniBand) had node-024's four probed paths all through
    the congested leaf-03~spine-02: its 100 us were its "host share", its pairs counted healthy,
    and the link sat at 0.70-0.72 consistency against the guard's 0.75 for 20 s. The prober's own
    node, ports, host links and leaf are left as they are: its own pairs are what clears them.
    """
    shared: dict[str, frozenset[str]] = {}
    counts: dict[str, int] = {}
    for src, dst in pairs:
        common = loc.round_trip(src, dst)[1]
        shared[src] = shared[src] & common if src in shared else common
        counts[src] = counts.get(src, 0) + 1
    out = {}
    for src, common in shared.items():
        if counts[src] < 2:
            continue  # one pair has no common mode to take out (delays: two at least)
        own = {loc.leaf(src), *(loc.leaf(h) for h in loc.hcas(src))}
        blind = frozenset(e for e in common if e not in own and _fabric(loc, e))
        if blind:
            out[src] = blind
    return out


def _fabric(loc: Localizer, key: str) -> bool:
    kind = loc.kind(link_of(key) if DIRECTED in key else key)
    return kind is ElementKind.FABRIC_LINK or kind is ElementKind.SWITCH


def _without(s: Symptom, blind: frozenset[str]) -> Symptom:
    return Symptom(s.ref, tuple(alt - blind for alt in s.alternatives), s.weight, s.pair, s.certain() - blind)
