"""Packet loss and link flaps.

* **link_flap**: a port seen going down (``link_downed``, ``link_down_events``, netlink
  ``carrier_changes``, or the IB ``state`` leaving ACTIVE between scrapes) blames its host link; on a
  fabric link (whose ends are switches, with no host counters) the flap shows as probe *outages*:
  pairs losing most of their probes for a few seconds, then recovering. Those pairs are localized
  through their paths.
* **packet_loss**: symbol/CRC/receive errors and discards are the port's own (its host link is to
  blame, "strong"); sequence errors and retransmissions are seen at the ends of flows that crossed a
  lossy element somewhere ("weak"); sustained probe loss between node pairs localizes it.

Probe loss during a flap is the flap's, not a second (packet_loss) incident; probe loss on pairs
crossing the element of an open packet_loss incident (a 60 s window still draining after the fault
cleared) is that incident's, not a new one elsewhere on the path.
"""

from __future__ import annotations

from fabricd.detect.base import PAIR_SIGNALS, EvalContext, by_leaf, spread
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
    out = cluster_network(ctx, IncidentKind.LINK_FLAP, Evidence3(pairs, ports, []), "is flapping", absorb_strong=False)
    # Between outages the flap incident is still open: its probe loss is still the flap's.
    _claim_crossing(ctx, [p.element for p in out] + sorted(ctx.open_elements.get(IncidentKind.LINK_FLAP, ())))
    return out


def _loss(ctx: EvalContext) -> list[Proposal]:
    found = ctx.of([IncidentKind.PACKET_LOSS])
    if not found:
        return []
    waiting = ctx.pending_of([IncidentKind.PACKET_LOSS])
    every = found + waiting
    ev = Evidence3(
        [f for f in every if f.signal == "probe_loss_ratio"],
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
    guard = PairGuard(int(ctx.param("loss_min_pairs", 2)), ctx.param("loss_consistency", 0.5), LOSS_PLACES)
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
    )


def _claim_crossing(ctx: EvalContext, elements: list[str]) -> None:
    """Probe loss and sequence errors on pairs/ports whose traffic crosses a flapping element."""
    if not elements:
        return
    blamed = set(elements)
    for f in ctx.signal(
        "probe_loss_ratio",
        "sequence_errors_per_second",
        "retransmits_per_second",
        "rtt_queue_outlier",
        "rtt_p99_outlier",
    ):
        if f.signal in PAIR_SIGNALS:
            alts = ctx.localizer.pair_paths(f.node, f.device)
            if any(blamed & alt for alt in alts):
                ctx.claim([f])
        elif {ctx.hca(f), ctx.localizer.host_link(ctx.hca(f))} & blamed:
            ctx.claim([f])
