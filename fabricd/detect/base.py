"""What every detector sees at one evaluation, and the helpers they share to build proposals."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fabricd.detect.findings import Finding
from fabricd.detect.incidents import Proposal, max_severity
from fabricd.detect.localize import Cluster, Localizer, Symptom
from fabricd.model import Candidate, Evidence, IncidentKind

PAIR_SIGNALS = frozenset({"probe_loss_ratio", "rtt_p99_outlier"})


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

    def param(self, name: str, default: float) -> float:
        return self.params.get(name, default)

    def of(self, kinds: Iterable[IncidentKind], signals: Iterable[str] | None = None) -> list[Finding]:
        ks, sig = set(kinds), set(signals) if signals is not None else None
        return [
            f
            for f in self.findings
            if id(f) not in self.claimed and f.rule.kind in ks and (sig is None or f.signal in sig)
        ]

    def signal(self, *signals: str) -> list[Finding]:
        wanted = set(signals)
        return [f for f in self.findings if id(f) not in self.claimed and f.signal in wanted]

    def claim(self, findings: Iterable[Finding]) -> None:
        self.claimed.update(id(f) for f in findings)

    def hca(self, f: Finding) -> str:
        return self.hca_of.get((f.node, f.device)) or self.localizer.hca(f.node, f.device)

    def healthy_symptoms(self, bad_pairs: set[tuple[str, str]]) -> list[Symptom]:
        loc = self.localizer
        return [loc.pair_symptom(p, p[0], p[1]) for p in self.healthy_pairs if p not in bad_pairs]

    def pair_symptoms(self, findings: Sequence[Finding]) -> list[Symptom]:
        return [self.localizer.pair_symptom(f, f.node, f.device) for f in findings]

    def open_network_elements(self) -> set[str]:
        """Elements of open network incidents and of network root causes proposed so far."""
        out = set(self.blamed)
        for kind, elements in self.open_elements.items():
            if kind not in (IncidentKind.STRAGGLER, IncidentKind.TAIL_LATENCY):
                out |= elements
        return out

    def claim_touching(self, signals: Iterable[str], ports: Collection[str]) -> list[Finding]:
        """Claim pair findings with an end on one of the HCA ``ports`` (in every path alternative),
        and per-node findings (NCCL) of those ports' nodes."""
        if not ports:
            return []
        nodes = {p.split("/", 1)[0] for p in ports}
        found = []
        for f in self.signal(*signals):
            if f.signal in PAIR_SIGNALS:
                used = self.localizer.pair_ports(f.node, f.device)
                if used and sum(share for port, share in used.items() if port in ports) >= 1.0 - 1e-9:
                    found.append(f)
            elif f.node in nodes:
                found.append(f)
        self.claim(found)
        return found


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
    )


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
    scope = f"{pairs} node pairs affected" if pairs else f"{nodes} node{'s' if nodes != 1 else ''} affected"
    value = f"{top.value:.1%}" if top.rule.condition.threshold < 1 and top.value <= 1 else f"{top.value:.3g}"
    summary = f"{element} {what} since {hhmm(started)} UTC, {scope}, {top.signal} at {value} on {top.node}"
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
    )


NETWORK_TYPES = frozenset({"fabric_link", "switch"})


@dataclass(slots=True)
class Evidence3:
    """Findings of one kind, by how much they say about where the fault is."""

    pairs: list[Finding]  # pair symptoms (probe loss, RTT): localize through paths
    strong: list[Finding]  # port counters that point at the port's own link
    weak: list[Finding]  # port counters of flows that merely crossed the fault somewhere


@dataclass(frozen=True, slots=True)
class PairGuard:
    """What a cluster backed by pairs alone must show to be blamed: enough pairs, an element of an
    allowed type, and consistency (most probed paths through the element bad: one slow pair, or a
    few slow pairs whose paths share an element that healthy pairs also cross, say nothing)."""

    min_pairs: int
    min_consistency: float
    types: frozenset[str]

    def passes(self, c: Cluster) -> bool:
        from fabricd.detect.localize import element_type

        return (
            c.pair_count >= self.min_pairs
            and c.consistency >= self.min_consistency
            and element_type(c.element) in self.types
        )


def cluster_network(
    ctx: EvalContext,
    kind: IncidentKind,
    ev: Evidence3,
    what: str,
    *,
    absorb_strong: bool,
    weak_weight: float = 0.25,
    guard: PairGuard | None = None,
    absorb_into: Collection[str] = (),
) -> list[Proposal]:
    """Vote over pair and port symptoms, then tidy the clusters into one proposal per root cause.

    A fabric-level cluster (a fabric link or a switch) is explained by pairs; port-only clusters next
    to it are the receivers and senders of flows that crossed it and are folded into it (for
    congestion) unless their own counters point at their own link (``absorb_strong=False``: symbol
    errors are local). A cluster backed only by weak port symptoms is folded into the biggest
    cluster, or dropped when there is none: weak symptoms alone do not say where the fault is.

    ``guard``: a cluster of pairs only (no port counter of its own) is kept only when it passes;
    otherwise its findings stay unclaimed for the next detector. ``absorb_into``: elements of open
    incidents of this kind; a pairs-only cluster whose every pair crosses one of them is those
    incidents' lingering symptoms (a window still draining, a fault just cleared by healthy pairs),
    so it is claimed without a second incident.
    """
    loc = ctx.localizer
    bad_pairs = {(f.node, f.device) for f in ev.pairs}
    symptoms = ctx.pair_symptoms(ev.pairs)
    symptoms += [loc.port_symptom(f, ctx.hca(f)) for f in ev.strong]
    symptoms += [loc.port_symptom(f, ctx.hca(f), weak_weight) for f in ev.weak]
    if not symptoms:
        return []
    clusters = loc.explain(symptoms, ctx.healthy_symptoms(bad_pairs))
    strong_ids = set(id(f) for f in ev.strong)
    kept, folded = _tidy(clusters, absorb_strong, strong_ids)
    out = []
    for cluster in kept:
        if _lingering(ctx, cluster, absorb_into):
            ctx.claim(s.ref for s in cluster.symptoms)
            continue
        if (
            guard is not None
            and not any(id(s.ref) in strong_ids for s in cluster.symptoms)
            and not guard.passes(cluster)
        ):
            continue
        findings = [s.ref for s in cluster.symptoms] + [s.ref for c in folded.get(id(cluster), []) for s in c.symptoms]
        ctx.claim(findings)
        p = proposal(kind, cluster.element, cluster, findings, what)
        out.append(p)
        ctx.blamed.setdefault(cluster.element, p.key)
    return out


def _lingering(ctx: EvalContext, cluster: Cluster, open_elements: Collection[str]) -> bool:
    """Pairs only, all crossing an element that already has an open incident (not this one)."""
    if not open_elements or cluster.element in open_elements or any(not s.pair for s in cluster.symptoms):
        return False
    return all(ctx.localizer.crosses(s.ref.node, s.ref.device, open_elements) for s in cluster.symptoms)


def _tidy(
    clusters: list[Cluster], absorb_strong: bool, strong_ids: set[int]
) -> tuple[list[Cluster], dict[int, list[Cluster]]]:
    from fabricd.detect.localize import element_type

    def has_pairs(c: Cluster) -> bool:
        return any(s.pair for s in c.symptoms)

    def has_strong(c: Cluster) -> bool:
        return any(id(s.ref) in strong_ids for s in c.symptoms)

    fabric = [c for c in clusters if element_type(c.element) in NETWORK_TYPES and has_pairs(c)]
    kept: list[Cluster] = []
    folded: dict[int, list[Cluster]] = {}
    for c in clusters:
        local = element_type(c.element) not in NETWORK_TYPES
        if local and not has_pairs(c) and fabric and (absorb_strong or not has_strong(c)):
            folded.setdefault(id(fabric[0]), []).append(c)
        elif not has_pairs(c) and not has_strong(c):
            target = fabric[0] if fabric else (kept[0] if kept else None)
            if target is not None:
                folded.setdefault(id(target), []).append(c)
        else:
            kept.append(c)
    return kept, folded


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
    p = proposal(kind, leaf, None, found, what)
    uplinks = ctx.localizer.uplinks(leaf)
    p.candidates = [Candidate(leaf, round(share, 4))]
    p.candidates += [Candidate(u, round(share / len(uplinks), 4)) for u in uplinks]
    p.candidates += [Candidate(k, round(v / total, 4)) for k, v in ranked[1:3]]
    ctx.blamed.setdefault(leaf, p.key)
    return [p]
