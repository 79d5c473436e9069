"""Which end probed: a queue delays a round trip whoever sent the probe, and only the round trips
that cross it.

A pair's round trip crosses the same links whether ``a`` probes ``b`` or ``b`` probes ``a`` (with
its reply's own path, the same directed links when the routes are symmetric): a standing queue on
an element delays the probes of every prober whose paths cross it, on either side of it, and
leaves those probers' other paths alone. Slow pairs from probers behind one leaf only, that are as
slow over the paths missing the element as over those crossing it, while the pairs other leaves'
probers send through it stay healthy, follow the probers, not the element: their hosts' load,
shared because the hosts share something (a job placed on that leaf's nodes; in the live demo, the
agents started one after another, probing in step), which the prober's own common mode
(``fabricd.detect.delays``) did not take out because each host spared one pair (its shortest).

Measured: a CI run of the live demo (tests/cases/live, "leaf probes after the link") opened
``congestion leaf-03~spine-02`` on 7 slow pairs from leaf-03's four probers, at 0.76 consistency
against the guard's 0.75. The same probers' paths to other leaves over ``spine-01`` were as slow
(4 of 5), and the one pair another leaf's prober sent over that uplink (``node-007`` to
``node-011``) was healthy, as were the 7 they sent over the other uplink.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from fabricd.detect.base import EvalContext
from fabricd.detect.localize import Cluster, Localizer, Symptom
from fabricd.detect.roundtrip import DIRECTED, link_of

# The probers' paths missing the element that must be slow as well, at least this share of them:
# a queue on the element leaves them at the fleet's background (a few percent), the probers' own
# load puts them near the share of the paths through it. Half lies between.
ELSEWHERE_SLOW_SHARE = 0.5
ELSEWHERE_MIN_PAIRS = 2  # one path missing the element says nothing either way


def one_sided(ctx: EvalContext, cluster: Cluster, healthy: Sequence[Symptom]) -> bool:
    """Whether ``cluster``'s slow pairs are its probers' rather than a queue on its element: all
    from probers behind one leaf; pairs from probers elsewhere cross what they cross of the element
    (each candidate's, for "one of" several links) and are healthy; and the same probers' paths to
    other leaves that miss the element are slow too (``ELSEWHERE_SLOW_SHARE``)."""
    loc = ctx.localizer
    bad = [s for s in cluster.symptoms if s.pair]
    if not bad:
        return False
    shared = frozenset.intersection(*(_side(loc, s.ref.node) for s in bad))
    if len(shared) != 1:
        return False  # several leaves' probers, or a prober whose leaf is unknown
    leaf = next(iter(shared))
    places = [c.element for c in cluster.candidates] if cluster.ambiguous else [cluster.element]
    others = [s for s in healthy if leaf not in _side(loc, s.ref[0])]
    for place in places:
        keys = _keys(place, bad)
        if not keys or not any(keys <= s.certain() for s in others):
            return False  # nothing to compare: no path from elsewhere crosses it healthy
    return _slow_elsewhere(ctx, bad, leaf, places)


def _slow_elsewhere(ctx: EvalContext, bad: Sequence[Symptom], leaf: str, places: Collection[str]) -> bool:
    """Whether the probers of ``bad`` have paths to peers off ``leaf`` that miss ``places`` (and
    every element an incident holds: their slowness is known) slow by the same signal, at
    ``ELSEWHERE_SLOW_SHARE`` at least."""
    loc = ctx.localizer
    known = ctx.open_network_elements()
    probers = {s.ref.node for s in bad}
    signals = {s.ref.signal for s in bad}
    found = [*ctx.findings, *ctx.pending]
    slow = {(f.node, f.device) for f in found if f.signal in signals}
    # a queue score over the rule's clear but under its condition is neither slow nor healthy
    unsure = ctx.rtt_unsure if "rtt_queue_outlier" in signals else set()
    missing = [
        pair
        for pair in ctx.healthy_pairs
        if pair[0] in probers
        and (pair in slow or pair not in unsure)
        and leaf not in _side(loc, pair[1])
        and not any(e in alt for alt in loc.round_trip(*pair)[0] for e in (*places, *known))
    ]
    if len(missing) < ELSEWHERE_MIN_PAIRS:
        return False
    return sum(1 for pair in missing if pair in slow) >= ELSEWHERE_SLOW_SHARE * len(missing)


def _side(loc: Localizer, node: str) -> frozenset[str]:
    """The leaves a node's HCAs sit behind."""
    return frozenset(leaf for h in loc.hcas(node) if (leaf := loc.leaf(h)) is not None)


def _keys(place: str, bad: Sequence[Symptom]) -> frozenset[str]:
    """What of ``place`` every slow pair certainly crosses: the element, and its directions when
    replies take paths of their own (a queue sits on one direction)."""
    common = frozenset.intersection(*(s.certain() for s in bad))
    return frozenset(k for k in common if k == place or (DIRECTED in k and link_of(k) == place))
