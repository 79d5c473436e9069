"""The greedy cover's second look: a cluster blamed on pairs alone must stand on the pairs that no
other blamed element explains.

The localizer's greedy cover (``localize.Localizer.explain``) gives each bad pair to the first
element that explains it. Without path traces a pair between two leaves crosses both leaves'
uplinks on every alternative, so a lossy uplink of one leaf also votes for the other leaf's. Which
leaf comes first depends on which pairs fired first, and the second then stands on the pairs the
first one left it, against a denominator the shared pairs have left too. A routed-lab CI run (loss
on ``ib-leaf-4~ib-spine-2``, untraced) opened ``ib-leaf-5`` beside ``ib-leaf-4``: 25 pairs, of which
the pairs from ``ib-leaf-4``'s hosts were ``ib-leaf-4``'s, and the rest 7 of the 32 pairs between
the other two leaves, each losing a probe a minute on a saturated machine.

So, as the reverse-delete step of set cover does (a set whose elements the others already cover is
dropped), each such cluster is judged again, weakest first, on its own pairs: those whose round
trips do not all cross another blamed element (another cluster passing the guard now, or an open
incident of this kind). It stays only when its own pairs still elect it and pass the pair guard.
A real second fault has pairs of its own that only it explains and passes; noise that rode on
another fault's pairs does not. The shared pairs are the other element's evidence.

Elements next to each other (a switch and its own links) are not rivals here: one is the other
narrowed or widened (``network._sticky``, incidents.py), the same fault.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from fabricd.detect.base import EvalContext
from fabricd.detect.localize import Cluster, Localizer, Symptom

if TYPE_CHECKING:
    from fabricd.detect.network import PairGuard


def stand_alone(
    ctx: EvalContext,
    kept: list[Cluster],
    folded: dict[int, list[Cluster]],
    guard: PairGuard,
    healthy: Sequence[Symptom],
    marked: set[int],
    opened: Collection[str],
    corroborated: bool,
) -> list[Cluster]:
    """``kept`` without the pairs-only network clusters that do not stand on their own pairs; their
    shared pairs join the blamed cluster that explains them (``folded``), or are claimed when an
    open incident's element does. ``marked``: ids of fired strong findings (a cluster with its own
    port counters is not pairs alone)."""
    loc = ctx.localizer
    network = {"fabric_link", "switch"}  # network.NETWORK_TYPES (network.py imports this module)

    def pairs_only(c: Cluster) -> bool:
        return not any(id(s.ref) in marked for x in (c, *folded.get(id(c), [])) for s in x.symptoms)

    def passes(c: Cluster) -> bool:
        return guard.passes(c, corroborated and c.kind in network, healthy)

    fabric = [c for c in kept if c.kind in network]
    if not fabric or len(fabric) + len(opened) < 2:
        return kept  # no other element to explain a pair
    blamed = [c for c in fabric if not pairs_only(c) or passes(c)]
    dropped: set[int] = set()
    for c in reversed(blamed):  # the cover's order is by score: the weakest first
        if not pairs_only(c):
            continue
        others = [r for r in blamed if r is not c and id(r) not in dropped and not _adjacent(loc, c.element, r.element)]
        rivals = {r.element for r in others} | {e for e in opened if not _adjacent(loc, c.element, e)}
        shared = [s for s in c.symptoms if s.pair and loc.crosses(s.ref.node, s.ref.device, rivals)]
        if not shared:
            continue
        taken = {id(s) for s in shared}
        own = [s for s in c.symptoms if id(s) not in taken]
        if own and _elected(loc, c.element, own, healthy, passes):
            continue
        dropped.add(id(c))
        _hand_over(ctx, loc, shared, others, folded)
    return [c for c in kept if id(c) not in dropped]


def _elected(
    loc: Localizer, element: str, own: list[Symptom], healthy: Sequence[Symptom], passes: Callable[[Cluster], bool]
) -> bool:
    """Whether ``own`` alone still elects ``element`` and its cluster passes the guard."""
    mine = next((x for x in loc.explain(own, healthy) if x.element == element), None)
    return mine is not None and passes(mine)


def _hand_over(
    ctx: EvalContext, loc: Localizer, shared: list[Symptom], others: list[Cluster], folded: dict[int, list[Cluster]]
) -> None:
    """Each shared pair to the first cluster of ``others`` whose element it crosses (its evidence);
    the rest cross an open incident's element: claimed, as that incident's (``lingering``)."""
    rest = list(shared)
    for r in others:
        mine = [s for s in rest if loc.crosses(s.ref.node, s.ref.device, [r.element])]
        if mine:
            folded.setdefault(id(r), []).append(replace(r, symptoms=mine))
            given = {id(s) for s in mine}
            rest = [s for s in rest if id(s) not in given]
    ctx.claim(s.ref for s in rest)


def lingering(ctx: EvalContext, cluster: Cluster, open_elements: Collection[str]) -> bool:
    """Pairs only, all crossing an element that already has an open incident (not this one): that
    incident's symptoms still draining, not a second one (the case where no pair is its own)."""
    if not open_elements or cluster.element in open_elements or any(not s.pair for s in cluster.symptoms):
        return False
    return all(ctx.localizer.crosses(s.ref.node, s.ref.device, open_elements) for s in cluster.symptoms)


def _adjacent(loc: Localizer, a: str, b: str) -> bool:
    """The same element, or a switch and one of its own links."""
    return a == b or b in loc.fabric_links(a) or a in loc.fabric_links(b)
