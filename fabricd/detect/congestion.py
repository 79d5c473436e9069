"""Congestion: ECN marks and CNPs (RoCE), XmitWait (InfiniBand), qdisc backlog and shaping (Linux),
localized by the pairs whose RTT went up.

A busy link is not a congested one: utilization alone never fires (it is kept as context in the
evidence). The signals that fire are the ones a congested queue produces: packets marked CE at the
receivers behind it (``ecn_marked_ratio``, ``cnp_sent_packets_per_second``), senders throttled
(``cnp_handled_packets_per_second``), credit starvation (``xmit_wait_ratio``), a standing qdisc backlog.

Receivers' ECN marks and CNPs say a flow into them crossed a congested queue, not which one; the
pairs whose p99 RTT rose above their baseline say which links; ``cluster_network`` folds the
receivers' port symptoms into the fabric-level element the pairs point at, and blames a host link
when only its own port shows the marks (an incast onto one receiver).

Queueing without counters: InfiniBand's ``port_xmit_wait`` is a 32-bit saturating counter that a
congested port fills within one scrape (after which it has no rate and never fires), and a fabric
may run without ECN. The pairs then carry the congestion alone: sustained p99 RTT outliers on
several pairs whose paths share one fabric link or switch, with (nearly) every probed path through it slow
(``congestion_rtt_*`` params), is a standing queue there: the delay a congested queue adds is what
the probes measure (Pingmesh's reading of latency without loss). Slow pairs that no link or switch
explains that consistently are left to the tail-latency detector.

Without pair evidence and with marks on several ports, the congested queue is in the fabric: every
marked flow has one end behind the leaf that holds it, so that leaf carries the largest share of the
CNPs (sent by its receivers, handled by its senders) and is blamed, its uplinks as candidates (which
uplink needs paths: docs/detection.md, blind spots).
"""

from __future__ import annotations

from fabricd.detect.base import EvalContext, Evidence3, PairGuard, by_leaf, cluster_network, spread
from fabricd.detect.incidents import Proposal
from fabricd.model import IncidentKind

STRONG = frozenset(
    {"ecn_marked_ratio", "cnp_sent_packets_per_second", "qdisc_backlog_bytes", "qdisc_overlimits_per_second"}
)
WEAK = frozenset({"cnp_handled_packets_per_second", "xmit_wait_ratio"})


# RTT alone blames a queue only inside the fabric: slow pairs that all share one end host may be the
# host answering slowly as well as its link queueing, so without marks they are tail latency.
QUEUE_ELEMENTS = frozenset({"fabric_link", "switch"})


def propose(ctx: EvalContext) -> list[Proposal]:
    found = ctx.of([IncidentKind.CONGESTION])
    pairs = ctx.signal("rtt_p99_outlier")
    if not found and not pairs:
        return []
    ev = Evidence3(pairs, [f for f in found if f.signal in STRONG], [f for f in found if f.signal in WEAK])
    if not pairs and spread(ctx, ev.strong):
        return by_leaf(ctx, IncidentKind.CONGESTION, found, "(or one of its uplinks) is congested")
    guard = PairGuard(
        int(ctx.param("congestion_rtt_min_pairs", 3)), ctx.param("congestion_rtt_consistency", 0.75), QUEUE_ELEMENTS
    )
    return cluster_network(
        ctx,
        IncidentKind.CONGESTION,
        ev,
        "is congested",
        absorb_strong=True,
        guard=guard,
        absorb_into=ctx.open_elements.get(IncidentKind.CONGESTION, set()),
    )
