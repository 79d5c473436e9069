"""Votes over pair and port symptoms for faults on the network (congestion, loss, flaps, tail
latency): ``cluster_network`` and the rules that tidy its clusters into one proposal per root cause
(folding receivers into the fabric queue they sit behind, holding a host's own link until the probes
had their chance, hysteresis on an open link). Split from ``base.py`` (what every detector shares)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from fabricd.detect.base import EvalContext, proposal
from fabricd.detect.cover import lingering, stand_alone
from fabricd.detect.findings import Finding
from fabricd.detect.incidents import Proposal
from fabricd.detect.localize import Cluster, Symptom
from fabricd.model import IncidentKind

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
    excluded: frozenset[str] = frozenset()  # elements another detector explains
    marked_consistency: float | None = None  # asked instead while fired marks behind several leaves concur
    witness: Callable[[Cluster], bool] | None = None  # under min_pairs: do NCCL runs stand for the rest
    probers_alone: Callable[[Cluster, Sequence[Symptom]], bool] | None = None  # ``sides.one_sided``
    beyond_leaf: Callable[[Cluster, Sequence[Symptom]], bool] | None = None  # ``below.beyond_leaf``
    background: Callable[[Cluster, Sequence[Symptom]], bool] | None = None  # ``background.py``, last

    def passes(self, c: Cluster, marked: bool = False, healthy: Sequence[Symptom] = ()) -> bool:
        need = min(self.min_consistency, self.marked_consistency or 1.0) if marked else self.min_consistency
        if c.element in self.excluded or c.consistency < need or c.kind not in self.types:
            return False
        enough = c.pair_count >= self.min_pairs or (c.pair_count > 0 and self.witness is not None and self.witness(c))
        return enough and not any(
            v(c, healthy) for v in (self.probers_alone, self.beyond_leaf, self.background) if v is not None
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
    pending: Collection[Finding] = (),
    places: Collection[str] | None = None,
    local_hold_seconds: float = 0.0,
    sticky: bool = False,
    weak_alone_waits: bool = False,
    unsure: Collection[tuple[str, str]] = (),
    common_mode: bool = False,
    shared_end_hold: float = 0.0,
    corroborated: bool = False,
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
    so it is claimed without a second incident. ``places``: the element types this kind of fault
    can sit on (a node is no queue); a cluster elsewhere is folded into the fabric-level cluster
    when there is one, else left unclaimed. ``local_hold_seconds``: a cluster on a host's own link
    or port with no pair of its own is proposed only once its symptoms have lasted this long (a
    receiver behind a fabric queue shows marks before the probes crossing the queue have had their
    two scrapes); until then its findings stay unclaimed. ``pending``: the findings in ``ev`` whose ``for``
    has not passed; they vote, but a cluster of pending findings only is not proposed (yet).
    ``sticky``: a fabric-level cluster that still points at an open incident's element nearly as
    strongly as at its winner is proposed on that element (``STICKY_SHARE``). ``weak_alone_waits``:
    a cluster whose only fired symptoms are weak waits until one of its others fires (a pending
    strong symptom may be one isolated error; weak symptoms alone do not say where). ``unsure``:
    probe pairs that are neither bad nor healthy (a delay in the rule's hysteresis band), left out
    of the healthy pairs that count against an element. ``common_mode``: the pairs are delays with
    their prober's common mode taken out (``EvalContext.healthy_symptoms``). ``shared_end_hold``:
    a cluster of pairs only, all ending at one node, waits this long (``_shared_end``).
    ``corroborated``: port symptoms behind several leaves blame the fabric: the guard's marked form.
    """
    loc = ctx.localizer
    bad_pairs = {(f.node, f.device) for f in ev.pairs}
    symptoms = ctx.pair_symptoms(ev.pairs)
    symptoms += [loc.port_symptom(f, ctx.hca(f)) for f in ev.strong]
    symptoms += [loc.port_symptom(f, ctx.hca(f), weak_weight) for f in ev.weak]
    if not symptoms:
        return []
    healthy = ctx.healthy_symptoms(bad_pairs | set(unsure), common_mode)
    waiting = {id(f) for f in pending}
    spread = bool(local_hold_seconds) and _marked_leaves(ctx, ev.strong, waiting) > 1
    # marks behind several leaves: one queue's receivers, whose pairs are placed among themselves
    # first (their host links took a live demo's first five pairs: tests/cases/live, "receivers take")
    split = [[s for s in symptoms if s.pair], [s for s in symptoms if not s.pair]] if spread else [symptoms]
    clusters = [c for part in split for c in loc.explain(part, healthy)]
    strong_ids = set(id(f) for f in ev.strong)
    fired_strong = strong_ids - waiting  # pending marks spare no guard (a loaded CI host: tests/cases/live)
    opened = [e for e in absorb_into if loc.kind(e) in NETWORK_TYPES]
    kept, folded = _tidy(clusters, absorb_strong, strong_ids, opened)
    if places is not None:
        kept = _fold_misplaced(ctx, kept, folded, places, LOCAL_PAIRS if local_hold_seconds else 0, opened)
    if guard is not None and absorb_strong:
        kept = _fold_stray_local(ctx, kept, folded, opened)
    if guard is not None:
        kept = stand_alone(ctx, kept, folded, guard, healthy, fired_strong, absorb_into, corroborated)
    out = []
    weak_ids = {id(f) for f in ev.weak} if weak_alone_waits else set()
    for cluster in kept:
        fabric_loss = corroborated and cluster.kind in NETWORK_TYPES
        if _waiting(cluster, folded.get(id(cluster), []), waiting, guard, ctx, absorb_into, spread or fabric_loss):
            continue
        if weak_ids and _weak_alone(cluster, folded.get(id(cluster), []), waiting, weak_ids):
            continue
        if local_hold_seconds and _young_local(ctx, cluster, local_hold_seconds, ev.pairs, spread):
            continue
        if shared_end_hold and _shared_end(ctx, cluster, shared_end_hold):
            continue
        if lingering(ctx, cluster, absorb_into):
            ctx.claim(s.ref for s in cluster.symptoms)
            continue
        if absorb_strong and _receivers_of_open(ctx, cluster, absorb_into):
            ctx.claim(s.ref for s in cluster.symptoms)
            ctx.active.update(_queue_of(kind, absorb_into, ctx))
            continue
        marks = [s for c in (cluster, *folded.get(id(cluster), [])) for s in c.symptoms if id(s.ref) in fired_strong]
        if guard is not None and not marks and not guard.passes(cluster, fabric_loss, healthy):
            continue
        findings = [s.ref for s in cluster.symptoms] + [s.ref for c in folded.get(id(cluster), []) for s in c.symptoms]
        ctx.claim(findings)
        element = (_sticky(cluster, absorb_into, ctx) if sticky else None) or cluster.element
        p = proposal(kind, element, cluster, findings, what)
        out.append(p)
        ctx.blamed.setdefault(element, p.key)
    return out


def _weak_alone(cluster: Cluster, folded: Sequence[Cluster], waiting: set[int], weak: set[int]) -> bool:
    """Whether every fired symptom of ``cluster`` (and what was folded into it) is weak."""
    return all(id(s.ref) in waiting or id(s.ref) in weak for c in (cluster, *folded) for s in c.symptoms)


def _waiting(
    cluster: Cluster,
    folded: Sequence[Cluster],
    waiting: set[int],
    guard: PairGuard | None,
    ctx: EvalContext,
    open_elements: Collection[str],
    spread: bool = False,
) -> bool:
    """Not proposed yet: every symptom pending, or the cluster's own symptoms pending and short of
    the pair guard (its majority form while fired marks sit behind several leaves, ``spread``: the
    ends of one fabric queue's flows; an HOL root's marks on one port, beside the pending pairs of
    its paused leaf, opened that leaf as congested before HOL blocking at 50 %). Receivers' marks
    that fired (two scrapes) beside the first slow probes of a fabric queue confirm it while the
    probes' own ``for`` runs: an interval sooner, which live delivery needs to report within two
    intervals (the probes' min RTT shows a queue only from the first scrape interval wholly inside
    the fault; docs/detection.md, "Time to detect, live"). Only
    at a fault's onset: while another fabric incident is open, the marks are its receivers', and a
    new cluster of first slow pairs waits for them to fire.

    Where pairs alone never blame the element (a host link for congestion: RTT cannot tell its
    queue from the host answering late), the element's own counters must have fired: a sender's
    noisy pair that fired before a fabric queue formed, with its first marks and first slow pairs
    through the queue (pending), is no queue on its link (CI's live eval opened one so)."""
    if guard is not None and cluster.kind not in guard.types:
        own = [s for c in (cluster, *folded) for s in c.symptoms if not s.pair]
        if own and all(id(s.ref) in waiting for s in own):
            return True
    if all(id(s.ref) in waiting for s in cluster.symptoms):
        if all(id(s.ref) in waiting for c in folded for s in c.symptoms):
            return True
        elsewhere = any(e != cluster.element and ctx.localizer.kind(e) in NETWORK_TYPES for e in open_elements)
        return elsewhere or guard is None or not guard.passes(cluster, marked=spread)
    return False


# An open incident on a fabric link keeps its element while the vote for the switch at one of its
# ends still gives the link at least this share of the switch's score. The scores are sums over
# noisy pair findings that come and go scrape by scrape; a link and the switch at its end differ only
# by the few pairs that cross the switch but not the link, so one stray slow pair can flip the winner
# from the link to its switch. Hysteresis (as in flap damping): the coarser switch takes over only
# when it wins by more than a factor of two. Only that direction: a finer element winning over an
# open coarser one narrows it (incidents.py), and two links or two switches are two places.
STICKY_SHARE = 0.5


def _sticky(cluster: Cluster, open_elements: Collection[str], ctx: EvalContext) -> str | None:
    """The open incident's link at this switch-level cluster's switch that the cluster still points
    at nearly as strongly as at the switch, if any (the same fault, not a second one)."""
    if cluster.kind != "switch" or cluster.element in open_elements or not cluster.candidates:
        return None
    top = max(c.score for c in cluster.candidates)
    mine = set(ctx.localizer.fabric_links(cluster.element)) & set(open_elements)
    held = [c for c in cluster.candidates if c.element in mine and c.score >= STICKY_SHARE * top]
    return max(held, key=lambda c: (c.score, c.element)).element if held else None


LOCAL_PAIRS = 3


def _local_pairs(cluster: Cluster) -> int:
    """The slow pairs that speak for a host's own link: a queue into the host delays the probes of
    other nodes into it as well as the replies to its own, so pairs all probed by one node (the host
    itself: its requests may all cross one fabric queue) count for nothing. Measured: CI's live eval
    opened ``node-008/mlx5_0~leaf-02`` on its receiver marks and three of its own probes through the
    congested uplink, a scrape before the other probers' pairs showed that uplink."""
    probers = {s.ref.node for s in cluster.symptoms if s.pair}
    return cluster.pair_count if len(probers) >= 2 else 0


def _marked_leaves(ctx: EvalContext, strong: Sequence[Finding], waiting: set[int]) -> int:
    """How many leaves the fired strong port symptoms sit behind."""
    return len({ctx.localizer.leaf(ctx.hca(f)) for f in strong if id(f) not in waiting} - {None})


def _young_local(ctx: EvalContext, cluster: Cluster, hold: float, pairs: Sequence[Finding], spread: bool) -> bool:
    """Whether a host's own cluster still waits for the probes (``local_hold_seconds``). While bad
    pairs that do not cross it are firing or pending, a fabric queue may be forming whose pairs have
    not all had their two scrapes: the hold runs twice as long. Live, with the agents' deliveries
    spread over the interval, the receivers' marks outlasted three intervals by a second while the
    fabric link's third pair was one scrape short of the guard (`make demo`'s scenario opened four
    receivers' host links beside the right link, 1 run in 5). An incast onto the host is not held
    longer: its probes cross its link.

    While the fired marks sit behind two leaves at least (``spread``), the hold does not run out:
    receivers marked behind several leaves at once are the ends of one fabric queue's flows, not
    as many queues. Live, a loaded host's probes left the queue's pairs under the guard for a minute
    and six receivers' links opened once the hold ran out (a CI run of ``tests/test_demo.py``)."""
    # exempt: a host link many probes say is slow (3 pairs, as for congestion from pairs alone)
    if cluster.kind not in ("host_link", "hca") or _local_pairs(cluster) >= LOCAL_PAIRS:
        return False
    if spread:
        return True
    age = ctx.now - min(s.ref.started_ts for s in cluster.symptoms)
    if age < hold:
        return True
    loc = ctx.localizer
    return age < 2 * hold and any(not loc.crosses(f.node, f.device, [cluster.element]) for f in pairs)


def _shared_end(ctx: EvalContext, cluster: Cluster, hold: float) -> bool:
    """Whether a cluster of pairs only, every pair ending at one node, is younger than ``hold``: the
    node's own link and a fabric link all its pairs crossed explain them alike until its port's
    counters and the pairs elsewhere have been scraped (docs/detection.md, "Packet loss and link
    flaps"; tests/test_eval_variants.py)."""
    if not all(s.pair for s in cluster.symptoms):
        return False  # a port's own counters (its link_downed) place it
    ends = set.intersection(*({s.ref.node, s.ref.device} for s in cluster.symptoms))
    return bool(ends) and ctx.now - min(s.ref.started_ts for s in cluster.symptoms) < hold


def _receivers_of_open(ctx: EvalContext, cluster: Cluster, open_elements: Collection[str]) -> bool:
    """Port symptoms only, on a host, while a fabric incident of this kind is open: the ends of flows
    that crossed it, whose marks outlast its probes as the fault winds down, not a fault of their own."""
    if any(s.pair for s in cluster.symptoms) or cluster.kind in NETWORK_TYPES:
        return False
    return any(ctx.localizer.kind(e) in NETWORK_TYPES for e in open_elements)


def _queue_of(kind: IncidentKind, open_elements: Collection[str], ctx: EvalContext) -> list[str]:
    """The key of the one open fabric incident receivers' marks keep alive (they last as long as its
    queue; tests/cases/live, "link quiet"); with two open, whose receivers they are is unknown."""
    fabric = [e for e in open_elements if ctx.localizer.kind(e) in NETWORK_TYPES]
    return [f"{kind.value}:{fabric[0]}"] if len(fabric) == 1 else []


def _fold_misplaced(
    ctx: EvalContext,
    kept: list[Cluster],
    folded: dict[int, list[Cluster]],
    places: Collection[str],
    local_pairs: int,
    opened: Collection[str],
) -> list[Cluster]:
    """Clusters on no place for this fault, and (``local_pairs``) local clusters with fewer pairs
    than that beside a fabric-level cluster, join the fabric cluster: a receiver behind a fabric
    queue has its marks and maybe a stray slow pair, not a queue of its own. While a fabric
    incident is open (``opened``) only its cluster takes them (``_marks_target``); with its cluster
    absent this evaluation, a local cluster stays for ``_fold_stray_local`` and a misplaced one's
    port symptoms are claimed by the open incident."""
    fabrics = [c for c in kept if c.kind in NETWORK_TYPES]
    target = _marks_target(fabrics, opened)
    out = []
    for c in kept:
        local = c.kind not in NETWORK_TYPES
        if c.kind in places and not (local and fabrics and _local_pairs(c) < local_pairs):
            out.append(c)
            continue
        if target is not None:
            folded.setdefault(id(target), []).append(c)
        elif opened and c.kind in places:
            out.append(c)
        elif opened:
            ctx.claim(s.ref for s in c.symptoms if not s.pair)
    return out


def _marks_target(fabrics: Sequence[Cluster], opened: Collection[str]) -> Cluster | None:
    """The fabric-level cluster that takes receivers' marks: the open incident's queue while a
    fabric incident of this kind is open (None when its cluster is absent this evaluation), else the
    first. The marks say a flow crossed a congested queue, not which one; while one is known, they
    are its receivers'. Given to a new fabric cluster beside it, they would spare that cluster the
    pair guard (a cluster with marks needs no pair consensus): measured live, a load surge hid the
    open uplink's slow pairs for three scrapes, and ``leaf-02`` (11 pairs, consistency 0.39 against
    the guard's 0.75) opened on the uplink's receivers' marks; CI's run of tests/test_demo.py opened
    ``spine-01`` beside the open ``leaf-02~spine-01`` the same way."""
    if opened:
        return next((c for c in fabrics if c.element in opened), None)
    return next(iter(fabrics), None)


def _fold_stray_local(
    ctx: EvalContext, kept: list[Cluster], folded: dict[int, list[Cluster]], opened: Collection[str]
) -> list[Cluster]:
    """Beside a fabric queue (found now, or an open incident's), a host's own link or port is not a
    second queue on its receivers' marks plus some slow pairs. The marks are explained: flows into
    the host crossed the fabric queue. What is left is pairs alone, and RTT alone never blames a host
    link (``congestion.QUEUE_ELEMENTS``: a host answering late looks the same). Measured: a loaded
    machine's live demo opened ``node-011/mlx5_0~leaf-03`` on 3 of its 8 probed paths, and in CI
    ``node-009/mlx5_0~leaf-03`` after 5 minutes of the fault, on 3 slow pairs against 1-3 healthy
    ones (a share of slow paths proved no guard on so few). The marks join the open incident's
    cluster (a new fabric cluster when none is open; claimed by the open incident when its cluster
    is absent this evaluation); the pairs stay unclaimed for the
    tail-latency detector. An incast during a fabric congestion is therefore reported once the
    fabric incident ends (docs/detection.md, blind spots)."""
    # The open incident's queue takes its receivers' marks; a new fabric cluster beside it does not
    # (folded marks would spare a few stray slow pairs the pair guard: a local demo run opened a second
    # link on a 0.06 score).
    fabric = _marks_target([c for c in kept if c.kind in NETWORK_TYPES], opened)
    if fabric is None and not opened:
        return kept
    out = []
    for c in kept:
        if c.kind in NETWORK_TYPES or not c.pair_count:
            out.append(c)
            continue
        marks = [s for s in c.symptoms if not s.pair]
        if fabric is not None:
            folded.setdefault(id(fabric), []).append(replace(c, symptoms=marks))
        else:
            ctx.claim(s.ref for s in marks)
    return out


def _tidy(
    clusters: list[Cluster], absorb_strong: bool, strong_ids: set[int], opened: Collection[str]
) -> tuple[list[Cluster], dict[int, list[Cluster]]]:
    """Port-only clusters join the fabric cluster whose flows they are (marks: ``_marks_target``;
    a marks-only cluster with no such target stays, for ``_receivers_of_open``)."""

    def has_pairs(c: Cluster) -> bool:
        return any(s.pair for s in c.symptoms)

    def has_strong(c: Cluster) -> bool:
        return any(id(s.ref) in strong_ids for s in c.symptoms)

    fabric = [c for c in clusters if c.kind in NETWORK_TYPES and has_pairs(c)]
    marks_to = _marks_target(fabric, opened)
    kept: list[Cluster] = []
    folded: dict[int, list[Cluster]] = {}
    for c in clusters:
        local = c.kind not in NETWORK_TYPES
        if local and not has_pairs(c) and fabric and (absorb_strong or not has_strong(c)):
            target = marks_to if has_strong(c) else fabric[0]
            if target is None:
                kept.append(c)
            else:
                folded.setdefault(id(target), []).append(c)
        elif not has_pairs(c) and not has_strong(c):
            target = fabric[0] if fabric else (kept[0] if kept else None)
            if target is not None:
                folded.setdefault(id(target), []).append(c)
        else:
            kept.append(c)
    return kept, folded
