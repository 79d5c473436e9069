"""Packet loss and link flaps.

* **link_flap**: a port seen going down (``link_downed``, ``link_down_events``, netlink
  ``carrier_changes``, or the IB ``state`` leaving ACTIVE between scrapes) blames its host link; on a
  fabric link (whose ends are switches, with no host counters) the flap shows as probe *outages*:
  pairs losing most of their probes for a few seconds, then recovering. Those pairs are localized
  through their paths.
* **packet_loss**: symbol/CRC/receive errors and discards are the port's own (its host link is to
  blame, "strong"); sequence errors and retransmissions are seen at the ends of flows that crossed a
  lossy element somewhere ("weak"); sustained probe loss between node pairs localizes it.

Probe loss during a flap is the flap's, not a second (packet_loss) incident, and so are the pairs
of its 60 s loss window after its outages ended: they cross the open flap's link and are not a
second flap either. While a link is flapping, retransmits and sequence errors anywhere are its too:
every RC queue pair with traffic through the link times out and retransmits, and its peer sees the
gap, whichever leaf the two ends are on (and an outage's show in the scrape after it, between
outages); such weak symptoms cannot say where their loss was, so while a flap is open they cannot
stand for another loss. Probe loss on pairs crossing the element of an open
packet_loss incident (a 60 s window still draining after the fault cleared) is that incident's, not
a new one elsewhere on the path.
"""

from __future__ import annotations

from functools import partial

from fabricd.detect.background import no_worse_than_elsewhere
from fabricd.detect.base import PAIR_SIGNALS, EvalContext, by_leaf, spread
from fabricd.detect.below import beyond_leaf
from fabricd.detect.incidents import Proposal
from fabricd.detect.network import Evidence3, PairGuard, cluster_network
from fabricd.model import IncidentKind

STRONG = frozenset({"phy_errors_per_second", "discards_per_second"})
WEAK = frozenset({"sequence_errors_per_second", "retransmits_per_second"})
# Where packets are lost: a link (its cable, optics, either end's PHY) or a switch; a node's probes
# lost whichever way they go is a host problem (a busy host drops replies), not the fabric's.
LOSS_PLACES = frozenset({"fabric_link", "switch", "host_link", "hca"})


def propose(ctx: EvalContext) -> list[Proposal]:
    out = _flaps(ctx)
    out.extend(_loss(ctx))
    return out


def _flaps(ctx: EvalContext) -> list[Proposal]:
    found = ctx.of([IncidentKind.LINK_FLAP])
    ports = [f for f in found if f.signal == "link_downs_per_second"]
    pairs = [f for f in found if f.signal == "probe_loss_ratio"]
    flapping = ctx.open_elements.get(IncidentKind.LINK_FLAP, set())
    # One pair's outage cannot say which of its links went down (the mixed scenario opened a flap
    # on the prober's own host link, a scrape before the flapping one's link_downed arrived): an
    # outage seen by pairs alone needs as many pairs as probe loss does (a link that goes down cuts
    # every pair through it at once). A host link's flap has its port's link_downed besides.
    guard = PairGuard(
        int(ctx.param("flap_min_pairs", 2)),
        ctx.param("flap_consistency", 0.5),
        LOSS_PLACES,
        background=no_worse_than_elsewhere(ctx, "probe_loss_ratio", [IncidentKind.LINK_FLAP]),
    )
    out = cluster_network(
        ctx,
        IncidentKind.LINK_FLAP,
        Evidence3(pairs, ports, []),
        "is flapping",
        absorb_strong=False,
        guard=guard,
        absorb_into=flapping,
        # the first outage pairs into a flapping host link may share one fabric link: wait until the
        # host's other pairs have been probed since (an interval) before blaming that link
        shared_end_hold=ctx.interval,
    )
    # Between outages the flap incident is still open: its probe loss is still the flap's, and so
    # are retransmits and sequence errors anywhere (an outage's show in the scrape after it: a
    # random fabric-link flap on RoCE opened packet_loss on another leaf from two such nodes).
    _claim_crossing(ctx, [p.element for p in out] + sorted(flapping), everywhere=bool(out or flapping))
    return out


def _loss(ctx: EvalContext) -> list[Proposal]:
    found = ctx.of([IncidentKind.PACKET_LOSS])
    if not found:
        return []
    waiting = [f for f in ctx.pending_of([IncidentKind.PACKET_LOSS]) if id(f) not in ctx.claimed]
    every = found + waiting
    # A pair in an outage (most of a scrape's probes lost) is the flap detector's while it waits to
    # say which link went down (``shared_end_hold``): its 60 s loss mean crosses 0.3 % in the same
    # scrape. An 8-node variant opened packet_loss on the flapping link, 0.6 s before its flap.
    outage = {(f.node, f.device) for f in ctx.of([IncidentKind.LINK_FLAP], ["probe_loss_ratio"])}
    outage |= {(f.node, f.device) for f in ctx.pending_of([IncidentKind.LINK_FLAP]) if f.signal == "probe_loss_ratio"}
    ev = Evidence3(
        [f for f in every if f.signal == "probe_loss_ratio" and (f.node, f.device) not in outage],
        [f for f in every if f.signal in STRONG],
        [f for f in every if f.signal in WEAK],
    )
    if not ev.pairs and not ev.strong and spread(ctx, ev.weak):
        # Sequence errors at the ends of many flows, no errors on any host port: a fabric link. As
        # for congestion's marks: only once they lasted an interval past firing, so that every node
        # had the chance to show where (its probes, its own port errors).
        if ctx.now - min(f.started_ts for f in found) < 2 * ctx.interval:
            return []
        weak = [f for f in found if f.signal in WEAK]
        return by_leaf(ctx, IncidentKind.PACKET_LOSS, weak, "(or one of its uplinks) is dropping packets")
    min_pairs, consistency = int(ctx.param("loss_min_pairs", 2)), ctx.param("loss_consistency", 0.5)
    guard = PairGuard(
        min_pairs,
        consistency,
        LOSS_PLACES,
        marked_consistency=ctx.param("loss_consistency_corroborated", 0.25),
        # a host link's pairs to other leaves may all have hashed onto one lossy uplink (below.py)
        beyond_leaf=partial(beyond_leaf, ctx, min_pairs, consistency),
        # a burst of lost probes all over the fleet is the hosts' (background.py)
        background=no_worse_than_elsewhere(ctx, "probe_loss_ratio", [IncidentKind.PACKET_LOSS]),
    )
    fired_weak = [f for f in found if f.signal in WEAK]
    return cluster_network(
        ctx,
        IncidentKind.PACKET_LOSS,
        ev,
        "is dropping packets",
        absorb_strong=False,
        guard=guard,
        absorb_into=ctx.open_elements.get(IncidentKind.PACKET_LOSS, set()),
        sticky=True,
        pending=waiting,
        places=LOSS_PLACES,
        # One isolated bit error is 0.2/s at a 5 s scrape, over phy_errors' 0.1/s: pending for a
        # scrape, it made a port whose flows merely crossed the loss (its sequence errors, weak)
        # a second lossy link.
        weak_alone_waits=True,
        corroborated=len({ctx.localizer.leaf(ctx.hca(f)) for f in fired_weak} - {None}) > 1,
    )


CROSSING = ("probe_loss_ratio", "rtt_queue_outlier", "rtt_p99_outlier", *sorted(WEAK))


def _claim_crossing(ctx: EvalContext, elements: list[str], everywhere: bool) -> None:
    """Claim, firing or still pending, the flapping elements' symptoms: probe loss and delay on
    pairs crossing one of them, and retransmits and sequence errors on their own ports, or
    wherever they are while a flap is open (``everywhere``; module doc): weak symptoms cannot say
    where their loss was, and another lossy element shows its own probe loss or port errors."""
    if not elements:
        return
    blamed = set(elements)
    pending = [f for f in ctx.pending if f.signal in CROSSING and id(f) not in ctx.claimed]
    for f in [*ctx.signal(*CROSSING), *pending]:
        if f.signal in PAIR_SIGNALS:
            if any(blamed & alt for alt in ctx.localizer.pair_paths(f.node, f.device)):
                ctx.claim([f])
        elif everywhere or {ctx.hca(f), ctx.localizer.host_link(ctx.hca(f))} & blamed:
            ctx.claim([f])
