"""Probe loss all over the fleet at once is the hosts', not an element's.

On a healthy fabric pingmesh loses no probes (``rules/detection/loss.yaml``), so the pairs that do
are the ones crossing the lossy element, and the pairs elsewhere stay clean. When hosts stall
together (a fleet's agents draining their spools at once after the central came back, a
synchronized job phase starving their CPUs), the probes they fail to send or answer in time are
lost on pairs anywhere: the engine's probing-failure share (``probe_storm_share``, 60 % of the
pairs) sets the whole moment aside, but a burst under it still left some element crossed by a
majority of bad pairs by chance. The routed lab under CI's load (9805d4d): 60 of its 132 pairs, on
every leaf, lost 1-6 probes within 3 s of a restart, and ``gpu-b04``'s host link, 8 of whose 22
pairs were among them (0.36, over the guard's corroborated 0.25), opened as a lossy link.

An element explains its pairs' loss only when they lose clearly more often than the pairs that
cannot cross it (nor an element already open or blamed, whose pairs are that fault's), whose share
of bad pairs ``b`` is the background:

* significantly: were each pair lost with probability ``b`` alone, ``k`` bad pairs of the ``n``
  probed through the element would be a chance under ``SIGNIFICANCE`` (the binomial tail). The
  likeliest of the tens of elements a burst touches passes at random far more often than one of
  them would: ``tests/test_detect_loss.py``'s burst on 16 nodes left ``spine-02`` with all 4 of
  its probed pairs bad at ``b`` = 0.45 (a 4 % chance for one element), and it opened;
* and by a margin: its consistency (the share of its probed paths that are bad) at least
  ``BACKGROUND_FACTOR`` times ``b``. Stalls are not independent pair by pair (a host that stalls
  loses all its pairs' probes at once), so the binomial understates the spread of a burst over
  many pairs. A real fault is far above it: its pairs lose, the pairs elsewhere do not.

``n`` and ``k`` come from the cluster: ``k`` its bad pairs, ``n`` = ``k`` / consistency (votes
weigh a pair by how far over its threshold it is, which only makes a real fault pass sooner). A
fault with nothing else going on has no bad pair elsewhere, ``b`` = 0, and passes as before; two
faults at once are each their own pairs' majority, while the other's pairs are a minority of the
rest (and once one is blamed its pairs leave the background). With a pair or two elsewhere losing
a probe now and then (``b`` ~ 0.02), 2 bad pairs of 4 are a 0.2 % chance and pass.

Both numbers are rule parameters (``loss_background_significance``, ``loss_background_factor`` in
``rules/detection/loss.yaml``); the constants here are their defaults.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

from fabricd.detect.base import EvalContext
from fabricd.detect.votes import Cluster, Symptom
from fabricd.model import IncidentKind

BACKGROUND_FACTOR = 2.0
SIGNIFICANCE = 0.01
Veto = Callable[[Cluster, Sequence[Symptom]], bool]


def no_worse_than_elsewhere(ctx: EvalContext, signal: str, kinds: Collection[IncidentKind]) -> Veto:
    """A ``PairGuard`` veto: the cluster's pairs do not stand out from the pairs elsewhere (bad: a
    finding of ``signal`` by a rule of ``kinds``, firing or pending; the module's doc)."""
    factor = ctx.param("loss_background_factor", BACKGROUND_FACTOR)
    significance = ctx.param("loss_background_significance", SIGNIFICANCE)
    bad = {(f.node, f.device) for f in (*ctx.findings, *ctx.pending) if f.signal == signal and f.rule.kind in kinds}
    shares: dict[frozenset[str], float | None] = {}

    def veto(c: Cluster, healthy: Sequence[Symptom] = ()) -> bool:
        place = frozenset({c.element, *(x.element for x in c.candidates if c.ambiguous)})
        place |= ctx.open_network_elements()
        if place not in shares:
            shares[place] = _bad_share_elsewhere(ctx, place, bad)
        b = shares[place]
        if not b:  # nothing elsewhere (or no pair elsewhere to say)
            return False
        k = c.pair_count
        n = max(k, round(k / c.consistency)) if c.consistency else k
        return c.consistency < factor * b or binomial_tail(k, n, b) >= significance

    return veto


def _bad_share_elsewhere(ctx: EvalContext, place: frozenset[str], bad: set[tuple[str, str]]) -> float | None:
    """The share of bad pairs among the recently probed pairs no round trip of which crosses
    ``place`` (None: there are none)."""
    loc = ctx.localizer
    count = lossy = 0
    for pair in ctx.healthy_pairs:
        if any(place & alt for alt in loc.round_trip(*pair)[0]):
            continue
        count += 1
        lossy += pair in bad
    return lossy / count if count else None


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space (n may be thousands of pairs)."""
    if k <= 0:
        return 1.0
    if p <= 0.0 or k > n:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k, n + 1):
        term = math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
        total += term
        if i > n * p and term < total * 1e-12:  # past the mode the terms only shrink
            break
    return min(1.0, total)
