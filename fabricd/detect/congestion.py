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

from functools import partial

from fabricd.detect import hol, runs, sides
from fabricd.detect.base import PAIR_SIGNALS, EvalContext, by_leaf, spread
from fabricd.detect.incidents import Proposal
from fabricd.detect.network import Evidence3, PairGuard, cluster_network
from fabricd.model import IncidentKind

STRONG = frozenset(
    {"ecn_marked_ratio", "cnp_sent_packets_per_second", "qdisc_backlog_bytes", "qdisc_overlimits_per_second"}
)
WEAK = frozenset({"cnp_handled_packets_per_second", "xmit_wait_ratio"})


# RTT alone blames a queue only inside the fabric: slow pairs that all share one end host may be the
# host answering slowly as well as its link queueing, so without marks they are tail latency.
QUEUE_ELEMENTS = frozenset({"fabric_link", "switch"})
# Where a congested queue can be: a switch port (fabric link, switch, the leaf side of a host link)
# or the HCA's own send queue; a node as a whole is no queue.
QUEUE_PLACES = frozenset({"fabric_link", "switch", "host_link", "hca"})


def propose(ctx: EvalContext) -> list[Proposal]:
    found = [f for f in ctx.of([IncidentKind.CONGESTION]) if f.signal not in PAIR_SIGNALS]
    pairs = ctx.signal("rtt_queue_outlier")
    if not found and not pairs:
        return []
    # Pending findings another detector explained (an HOL's paused hosts' pairs) do not vote here.
    waiting = [f for f in ctx.pending_of([IncidentKind.CONGESTION]) if id(f) not in ctx.claimed]
    found += [f for f in waiting if f.signal not in PAIR_SIGNALS]
    pairs += [f for f in waiting if f.signal == "rtt_queue_outlier"]
    ev = Evidence3(pairs, [f for f in found if f.signal in STRONG], [f for f in found if f.signal in WEAK])
    if not pairs and spread(ctx, ev.strong):
        # Marks with no pair to say which link: the leaf holding the largest share. Only once the
        # marks have lasted an interval past firing: by then every node scraped twice since they
        # began, so the probes crossing the queue had the same chance to show it as the marks.
        began = min(f.started_ts for f in ev.strong)
        if ctx.now - began < _pair_wait(ctx):
            return []
        return by_leaf(ctx, IncidentKind.CONGESTION, found, "(or one of its uplinks) is congested")
    # A leaf whose ports are slow whichever peer they probe is the head-of-line signature (pauses
    # or credits backing up into it), not a queue of its own: left to the HOL detector.
    stalled = hol.stalled_leaf(ctx) if pairs else None
    guard = PairGuard(
        int(ctx.param("congestion_rtt_min_pairs", 3)),
        ctx.param("congestion_rtt_consistency", 0.75),
        QUEUE_ELEMENTS,
        frozenset({stalled}) if stalled else frozenset(),
        ctx.param("congestion_rtt_consistency_marked", 0.5),
        partial(runs.confirm_queue, ctx),
        # a queue delays a round trip whoever probes it: slow pairs from one leaf's probers only,
        # beside healthy ones from elsewhere through the element, are the probers' (sides.py)
        partial(sides.one_sided, ctx),
    )
    out = cluster_network(
        ctx,
        IncidentKind.CONGESTION,
        ev,
        "is congested",
        absorb_strong=True,
        guard=guard,
        absorb_into=ctx.open_elements.get(IncidentKind.CONGESTION, set()),
        sticky=True,
        pending=waiting,
        places=QUEUE_PLACES,
        local_hold_seconds=_pair_wait(ctx),
        # A pair over 3 sigmas but not 6 (the rule's clear and condition) is no evidence that its
        # path has no queue: live, a loaded host's probe jitter kept 5 of the 13 pairs through the
        # demo's congested uplink between the two for 10 s, and counted healthy they held the link
        # under the guard's 75 % (docs/detection.md, "A noisy host's probes, live").
        unsure=ctx.rtt_unsure,
        common_mode=True,
    )
    # A queue delays the slowest probes too: the p99 outliers of pairs through it are its evidence,
    # not a tail-latency incident of their own.
    elements = [p.element for p in out] + sorted(ctx.open_elements.get(IncidentKind.CONGESTION, ()))
    ctx.claim(f for f in ctx.signal("rtt_p99_outlier") if ctx.localizer.crosses(f.node, f.device, elements))
    return out


def _pair_wait(ctx: EvalContext) -> float:
    """How long marks wait for the pairs before a leaf, or a receiver's own link, is blamed. With
    pingmesh running, the pairs through the queue need two consecutive outlier scrapes, the first at
    most an interval after the onset, then settlement: three intervals. Without probes, two (every
    node scraped twice). A receiver's marks can start within a second of the onset while the first
    slow probe through the fabric queue shows up to two intervals later (its min RTT needs a whole
    interval inside the fault), so two intervals of hold left no margin live: a loaded CI host opened
    the receiver's link beside the fabric link. A real incast is not held: probes into the receiver
    queue behind it too, and three slow pairs from two probers at least exempt a host link
    (``network.LOCAL_PAIRS``, ``network._local_pairs``)."""
    return (3 if ctx.healthy_pairs else 2) * ctx.interval
