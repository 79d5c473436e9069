"""Head-of-line blocking and PFC storms: separate the port causing the pauses from their victims.

In a lossless (PFC) fabric a switch whose egress queue for a priority fills pauses the ports that
feed it; every flow of that priority through a paused port stops, including flows headed elsewhere
(DOMAIN.md). What the hosts see:

* **victims**: ``rx_pause_ratio`` high (their NIC is being paused by the leaf) while their own
  receive side shows no congestion;
* **a PFC storm root**: a NIC that keeps pausing its switch: ``tx_pause_ratio`` near 1 and/or the
  NIC's pause-storm watchdog events (``tx_pause_storm_*_events``, mlx5);
* **an HOL root**: the congested receiver behind the pauses: the port with the congestion signal
  (ECN marks, CNPs sent) or moderate ``tx_pause_ratio`` on the leaf where the victims cluster.

The root is the incident's element; victims are ``affected``. Pauses spread along the tree: victims
on the root's leaf are paused most, hosts elsewhere sending into that leaf less, which is why the
root is searched on the leaf holding most of the victims' pause time.

Without pause counters (InfiniBand: credit back-pressure has no PFC counters, and the senders'
``port_xmit_wait`` saturates within a scrape), the stalled hosts are found by the probe pairs: a port
whose pairs are slow whichever peer it probes is itself stalled (``hol_stalled_*`` params). When
most probed ports behind one leaf are stalled, the pauses start there; the root is the port on that
leaf that is *not* stalled (the receiver under incast: its own sends do not queue behind the full
egress it is fed by) and receives the most (``rx_utilization``, the incast). A congested fabric link
does not look like this: only the pairs crossing it are slow, and every port also has healthy pairs.

Whatever the root, the pauses' victims are its symptoms, not incidents of their own: slow pairs with
an end on a paused or stalled port, the NCCL slowdowns of those nodes, and the throttled senders'
CNPs (``cnp_handled_packets_per_second``) are claimed by the storm or HOL incident.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from fabricd.detect.base import EvalContext, proposal
from fabricd.detect.findings import Finding
from fabricd.detect.incidents import Proposal
from fabricd.model import Candidate, IncidentKind

ROOT_SIGNALS = (
    "ecn_marked_ratio",
    "cnp_sent_packets_per_second",
    "tx_pause_ratio",
    "xmit_wait_ratio",
    "qdisc_backlog_bytes",
)
VICTIM_SIGNALS = (
    "rtt_queue_outlier",
    "rtt_p99_outlier",
    "nccl_time_outlier",
)  # what a paused host's pairs and jobs show
THROTTLED = ("cnp_handled_packets_per_second", "xmit_wait_ratio")  # senders slowed by someone else's queue


def propose(ctx: EvalContext) -> list[Proposal]:
    out = _storms(ctx)
    out.extend(_hol(ctx))
    _winding_down(ctx)
    return out


def _winding_down(ctx: EvalContext) -> None:
    """An open HOL incident whose pauses have stopped is still open: its root's last marks and CNPs
    (the scrape that held the incast's end) and the senders throttled by them are that incident's,
    as a storm winding down is that storm's, not a congestion of the root's host link opening as the
    fault clears. Marks that outlast the incident open congestion once it has resolved."""
    for root in sorted(ctx.open_elements.get(IncidentKind.HOL_BLOCKING, set()) - set(ctx.blamed)):
        pending = [f for f in ctx.pending if id(f) not in ctx.claimed]
        marks = [f for f in [*ctx.signal(*ROOT_SIGNALS), *pending] if f.signal in ROOT_SIGNALS and ctx.hca(f) == root]
        if marks:
            ctx.claim(marks)
            ctx.claim(ctx.signal(*THROTTLED))  # their CNPs come from the root's marks (_claim_victims)


def _storms(ctx: EvalContext) -> list[Proposal]:
    roots: dict[str, list[Finding]] = defaultdict(list)
    for f in ctx.of([IncidentKind.PFC_STORM]):
        roots[ctx.hca(f)].append(f)
    out = []
    for hca, found in sorted(roots.items()):
        victims = _victims(ctx, exclude=hca)
        ctx.claim(found + victims)
        ctx.claim(f for f in ctx.signal("rx_pause_ratio", "tx_pause_ratio") if ctx.hca(f) == hca)
        leaf = ctx.localizer.leaf(hca)
        stalled = {p for p in _stalled_ports(ctx) if leaf is None or ctx.localizer.leaf(p) == leaf}
        _claim_victims(ctx, {hca} | {ctx.hca(f) for f in victims} | stalled, found)
        cands = [Candidate(hca, 1.0, 1.0), Candidate(ctx.localizer.host_link(hca), 0.5, 0.5)]
        p = proposal(IncidentKind.PFC_STORM, hca, None, found + victims, "is in a PFC pause storm")
        p.candidates = cands
        p.affected = sorted({f.node for f in victims} | {f.node for f in found})
        out.append(p)
        ctx.blamed[hca] = p.key
    return out


def _victims(ctx: EvalContext, exclude: str) -> list[Finding]:
    """Every paused port other than the root: pauses spread upstream through the spines, so hosts
    on other leaves sending into the root's leaf are its victims too."""
    paused = ctx.of([IncidentKind.HOL_BLOCKING], ["rx_pause_ratio"])
    return [f for f in paused if ctx.hca(f) != exclude]


def _hol(ctx: EvalContext) -> list[Proposal]:
    victims = [f for f in ctx.of([IncidentKind.HOL_BLOCKING], ["rx_pause_ratio"])]
    stalled = _stalled_ports(ctx)
    if victims:
        leaf = _dominant_leaf(ctx, victims)
        root, score = _root(ctx, leaf, {ctx.hca(f) for f in victims})
    else:
        leaf = _stalled_leaf(ctx, stalled)
        root, score = _quiet_root(ctx, leaf, stalled) if leaf is not None else (None, 0.0)
    if root is None:
        return []  # pauses with no congested port to blame: left to the congestion detector
    firing_root = [
        f for f in ctx.findings if id(f) not in ctx.claimed and ctx.hca(f) == root and f.signal in ROOT_SIGNALS
    ]
    if victims and (not firing_root or _storm_pending(ctx, root)):
        # Pauses are spreading, and their root is not known for an HOL root yet. Either it has been
        # seen once (its first scrape after the onset holds part of an interval): whether it is a
        # storm (tx pause > 80 %) or a congested receiver, its next scrape says. Or it pauses its
        # switch as a stuck NIC does (a storm rule holds on it, tx pauses over 80 % of the time or
        # its watchdog) and only the rule's ``for`` has not run out: a storm in the making, not a
        # congested receiver, whose pauses come in bursts (with a 5 s scrape the "pausing root"
        # rule ran out first and opened HOL blocking on the storming port, beside the storm a
        # scrape later). Its victims wait with it rather than become congestion.
        ctx.claim(victims)
        _claim_victims(ctx, {root} | {ctx.hca(f) for f in victims} | set(stalled), victims)
        return []
    if root in ctx.open_elements.get(IncidentKind.PFC_STORM, set()) or _storm_now(ctx, root):
        # A storm winding down (the watchdog quiet, pauses still draining) is still that storm, and
        # so is one proposed in this same pass: at a 10 s scrape the storm and the "pausing root"
        # rules can run out together, and the root's stalled pairs opened HOL beside the storm.
        ctx.claim(victims)
        ctx.claim(f for f in ctx.findings if ctx.hca(f) == root)
        return []
    root_findings = [
        f
        for f in [*ctx.findings, *ctx.pending]
        if id(f) not in ctx.claimed and ctx.hca(f) == root and f.signal in ROOT_SIGNALS
    ]
    real_victims = [f for f in victims if ctx.hca(f) != root]
    stalled_ports = {p for p in stalled if p != root}
    ctx.claim(root_findings + victims)
    slow = _claim_victims(ctx, {root} | {ctx.hca(f) for f in victims} | stalled_ports, root_findings + victims)
    evidence = root_findings + real_victims + (slow if not real_victims else [])
    if not evidence:
        return []
    p = proposal(
        IncidentKind.HOL_BLOCKING, root, None, evidence, "is blocking its fabric (head-of-line: PFC pauses spreading)"
    )
    p.candidates = [Candidate(root, round(score, 4), round(score, 4))]
    p.candidates.append(Candidate(ctx.localizer.host_link(root), round(score / 2, 4), round(score / 2, 4)))
    if leaf:
        p.candidates.append(Candidate(leaf, round(score / 4, 4), round(score / 4, 4)))
    hosts = {ctx.localizer.node_of(x) for x in stalled_ports}
    p.affected = sorted({f.node for f in real_victims} | {h for h in hosts if h})
    ctx.blamed[root] = p.key
    return [p]


def _claim_victims(ctx: EvalContext, ports: set[str], found: Sequence[Finding]) -> list[Finding]:
    """Claim what the pauses around ``ports`` (root, paused, stalled) cause; returns the slow pairs
    and jobs of those ports. Throttled senders anywhere are the root's (their CNPs come from its
    marks); NCCL slowdowns that began once the pauses had begun are victims' too (a job is as slow as
    its most paused member and members rotate, so victims are not only the paused hosts), while a
    node already slow before (a straggler) keeps its finding. Ports seen paused once (their pause
    rule's ``for`` still running) are victims too, and pairs not fired yet are claimed with the
    fired ones: hosts scrape at their own phase, so while HOL waits for its root, a paused host's
    first slow pairs and the pending ones through it voted for its leaf as a congested switch and
    opened congestion there a scrape before HOL blocking (a 6-node random variant)."""
    ports = ports | {ctx.hca(f) for f in ctx.pending_of([IncidentKind.HOL_BLOCKING]) if f.signal == "rx_pause_ratio"}
    slow = ctx.claim_touching(VICTIM_SIGNALS, ports, pending=True)
    ctx.claim(ctx.signal(*THROTTLED))
    started = [f.started_ts for f in [*found, *slow]]
    if started:
        ctx.claim(f for f in ctx.signal("nccl_time_outlier") if f.started_ts >= min(started))
    return slow


def _stalled_ports(ctx: EvalContext) -> dict[str, float]:
    """HCA ports whose probe pairs are slow whichever peer they probe: port -> share of slow pairs."""
    bad_pairs = _slow_pairs(ctx)
    if not bad_pairs:
        return {}
    bad, total = _port_votes(ctx, bad_pairs)
    need, share = ctx.param("hol_stalled_min_pairs", 2), ctx.param("hol_stalled_consistency", 0.8)
    return {p: bad[p] / total[p] for p in bad if bad[p] >= need and bad[p] / total[p] >= share}


def _port_votes(ctx: EvalContext, bad_pairs: set[tuple[str, str]]) -> tuple[dict[str, float], dict[str, float]]:
    """Per HCA port, the probed pairs through it (slow ones, all ones)."""
    bad: dict[str, float] = defaultdict(float)
    total: dict[str, float] = defaultdict(float)
    for pair in ctx.healthy_pairs:
        for port, share in ctx.localizer.pair_ports(*pair).items():
            total[port] += share
            if pair in bad_pairs:
                bad[port] += share
    return bad, total


def stalled_leaf(ctx: EvalContext) -> str | None:
    """The leaf whose probed ports are mostly stalled (HOL's signature without pause counters)."""
    return _stalled_leaf(ctx, _stalled_ports(ctx))


def _stalled_leaf(ctx: EvalContext, stalled: dict[str, float]) -> str | None:
    """The leaf where most probed ports are stalled, if enough of them are (HOL's signature)."""
    if not stalled:
        return None
    _, total = _port_votes(ctx, set())
    probed: dict[str, int] = defaultdict(int)
    for port in total:
        leaf = ctx.localizer.leaf(port)
        if leaf is not None:
            probed[leaf] += 1
    count: dict[str, float] = defaultdict(float)
    for port, share in stalled.items():
        leaf = ctx.localizer.leaf(port)
        if leaf is not None:
            count[leaf] += share
    if not count:
        return None
    leaf = max(count, key=lambda k: (count[k], k))
    n = sum(1 for p in stalled if ctx.localizer.leaf(p) == leaf)
    if n < ctx.param("hol_min_stalled_ports", 3) or n / max(1, probed[leaf]) < ctx.param("hol_stalled_share", 0.5):
        return None
    if _pauses_counted(ctx) and not _paused_on(ctx, leaf):
        return None
    return leaf if _within_leaf_slow(ctx, leaf) else None


def _pauses_counted(ctx: EvalContext) -> bool:
    """Whether the fabric's ports count their pauses: on Ethernet (RoCE) head-of-line blocking *is*
    PFC pauses, which the hosts' ``rx/tx_prio*_pause_duration`` show, so ports slow with no pause
    seen are not HOL but a queue (or a loaded prober) the congestion detector weighs. Live, under a
    loaded CI host, the demo's congested uplink slowed most of its leaf's pairs, noise the rest, and
    the stall signature opened HOL blocking on a host of that leaf beside the congestion."""
    topo = ctx.localizer.topology
    return topo is not None and topo.link_layer != "infiniband"


def _paused_on(ctx: EvalContext, leaf: str) -> bool:
    """Whether a host behind ``leaf`` pauses or is paused (firing or its rule's ``for`` running)."""
    pauses = (f for f in [*ctx.findings, *ctx.pending] if f.signal in ("rx_pause_ratio", "tx_pause_ratio"))
    return any(ctx.localizer.leaf(ctx.hca(f)) == leaf for f in pauses)


def _within_leaf_slow(ctx: EvalContext, leaf: str) -> bool:
    """Whether the pairs that never leave ``leaf`` are slow too, as pauses make them: a paused port
    cannot send to any peer, its neighbours on the leaf included. A queue on the leaf's uplinks (or
    beyond) slows only the pairs crossing it, and with few peers per port, most of a port's pairs
    can cross it: then its pairs within the leaf are the ones still healthy. Without such pairs
    probed, nothing tells the two apart and the ports' shares decide alone."""
    inside = [pair for pair in ctx.healthy_pairs if _within(ctx, pair, leaf)]
    if len(inside) < ctx.param("hol_stalled_min_pairs", 2):
        return True
    slow = _slow_pairs(ctx)
    return sum(1 for pair in inside if pair in slow) / len(inside) >= ctx.param("hol_stalled_share", 0.5)


def _within(ctx: EvalContext, pair: tuple[str, str], leaf: str) -> bool:
    """Whether both ends of a probed pair are on ``leaf`` and no round trip of it leaves the leaf."""
    ports = ctx.localizer.pair_ports(*pair)
    if not ports or any(ctx.localizer.leaf(p) != leaf for p in ports):
        return False
    uplinks = set(ctx.localizer.uplinks(leaf))
    return not any(uplinks & alt for alt in ctx.localizer.round_trip(*pair)[0])


def _slow_pairs(ctx: EvalContext) -> set[tuple[str, str]]:
    """The probed pairs (prober, peer) with a queue outlier, firing or pending, that no incident
    proposed before (a storm's victims) has claimed."""
    pending = (f for f in ctx.pending if f.signal == "rtt_queue_outlier" and id(f) not in ctx.claimed)
    slow = [*ctx.signal("rtt_queue_outlier"), *pending]
    return {(f.node, f.device) for f in slow}


def _quiet_root(ctx: EvalContext, leaf: str, stalled: dict[str, float]) -> tuple[str | None, float]:
    """The probed port on ``leaf`` that is not stalled and receives the most; an open HOL incident's
    root keeps its place while it still qualifies (one incident, not one per re-ranking)."""
    _, total = _port_votes(ctx, set())
    free = [p for p in total if ctx.localizer.leaf(p) == leaf and p not in stalled]
    if not free:
        return None, 0.0
    kept = ctx.open_elements.get(IncidentKind.HOL_BLOCKING, set())
    best = max(free, key=lambda p: (p in kept, ctx.rx_utilization.get(p, 0.0), p))
    on_leaf = sum(1 for p in total if ctx.localizer.leaf(p) == leaf)
    return best, sum(1 for p in stalled if ctx.localizer.leaf(p) == leaf) / max(1, on_leaf)


def _dominant_leaf(ctx: EvalContext, victims: Sequence[Finding]) -> str | None:
    weight: dict[str, float] = defaultdict(float)
    for f in victims:
        leaf = ctx.localizer.leaf(ctx.hca(f))
        if leaf is not None:
            weight[leaf] += f.value
    return max(weight, key=lambda k: weight[k]) if weight else None


def _root(ctx: EvalContext, leaf: str | None, victims: set[str]) -> tuple[str | None, float]:
    """The congested port on the victims' leaf: most ECN / tx pause, not itself merely paused."""
    best, score = None, 0.0
    # pending ones too: the root scrapes at its own phase, its marks may be one observation old
    for f in [*ctx.findings, *ctx.pending]:
        if id(f) in ctx.claimed or f.signal not in ROOT_SIGNALS:
            continue
        hca = ctx.hca(f)
        if leaf is not None and ctx.localizer.leaf(hca) != leaf:
            continue
        s = f.value / (f.rule.condition.threshold or 1.0) + (0.5 if hca not in victims else 0.0)
        if s > score:
            best, score = hca, s
    return best, score


def _storm_now(ctx: EvalContext, root: str) -> bool:
    """Whether ``_storms`` blamed ``root`` in this pass."""
    key = ctx.blamed.get(root)
    return key is not None and key.split(":", 1)[0] == IncidentKind.PFC_STORM.value


def _storm_pending(ctx: EvalContext, root: str) -> bool:
    """Whether a PFC storm rule holds on ``root`` without firing yet (its ``for`` still running)."""
    return any(ctx.hca(f) == root for f in ctx.pending_of([IncidentKind.PFC_STORM]))
