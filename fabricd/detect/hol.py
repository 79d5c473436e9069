"""Head-of-line blocking and PFC storms: separate the port causing the pauses from their victims.

In a lossless (PFC) fabric a switch whose egress queue for a priority fills pauses the ports that
feed it; every flow of that priority through a paused port stops, including flows headed elsewhere
(DOMAIN.md). What the hosts see:

* **victims**: ``rx_pause_fraction`` high (their NIC is being paused by the leaf) while their own
  receive side shows no congestion;
* **a PFC storm root**: a NIC that keeps pausing its switch: ``tx_pause_fraction`` near 1 and/or the
  NIC's pause-storm watchdog events (``tx_pause_storm_*_events``, mlx5);
* **an HOL root**: the congested receiver behind the pauses: the port with the congestion signal
  (ECN marks, CNPs sent) or moderate ``tx_pause_fraction`` on the leaf where the victims cluster.

The root is the incident's element; victims are ``affected``. Pauses spread along the tree: victims
on the root's leaf are paused most, hosts elsewhere sending into that leaf less, which is why the
root is searched on the leaf holding most of the victims' pause time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from fabricd.detect.base import EvalContext, proposal
from fabricd.detect.findings import Finding
from fabricd.detect.incidents import Proposal
from fabricd.model import Candidate, IncidentKind

ROOT_SIGNALS = ("ecn_marked_fraction", "cnp_sent_rate", "tx_pause_fraction", "xmit_wait_fraction", "qdisc_backlog_bytes")


def propose(ctx: EvalContext) -> list[Proposal]:
    out = _storms(ctx)
    out.extend(_hol(ctx))
    return out


def _storms(ctx: EvalContext) -> list[Proposal]:
    roots: dict[str, list[Finding]] = defaultdict(list)
    for f in ctx.of([IncidentKind.PFC_STORM]):
        roots[ctx.hca(f)].append(f)
    out = []
    for hca, found in sorted(roots.items()):
        victims = _victims(ctx, exclude=hca)
        ctx.claim(found + victims)
        ctx.claim(f for f in ctx.signal("rx_pause_fraction", "tx_pause_fraction") if ctx.hca(f) == hca)
        cands = [Candidate(hca, 1.0), Candidate(ctx.localizer.host_link(hca), 0.5)]
        p = proposal(IncidentKind.PFC_STORM, hca, None, found + victims, "is in a PFC pause storm")
        p.candidates = cands
        p.affected = sorted({f.node for f in victims} | {hca.split("/", 1)[0]})
        out.append(p)
        ctx.blamed[hca] = p.key
    return out


def _victims(ctx: EvalContext, exclude: str) -> list[Finding]:
    """Every paused port other than the root: pauses spread upstream through the spines, so hosts
    on other leaves sending into the root's leaf are its victims too."""
    paused = ctx.of([IncidentKind.HOL_BLOCKING], ["rx_pause_fraction"])
    return [f for f in paused if ctx.hca(f) != exclude]


def _hol(ctx: EvalContext) -> list[Proposal]:
    victims = [f for f in ctx.of([IncidentKind.HOL_BLOCKING], ["rx_pause_fraction"])]
    if not victims:
        return []
    leaf = _dominant_leaf(ctx, victims)
    root, score = _root(ctx, leaf, {ctx.hca(f) for f in victims})
    if root is None:
        return []  # pauses with no congested port to blame: left to the congestion detector
    root_findings = [f for f in ctx.findings if id(f) not in ctx.claimed and ctx.hca(f) == root
                     and f.signal in ROOT_SIGNALS]  # fmt: skip
    real_victims = [f for f in victims if ctx.hca(f) != root]
    ctx.claim(root_findings + victims)
    p = proposal(IncidentKind.HOL_BLOCKING, root, None, root_findings + real_victims,
                 "is blocking its fabric (head-of-line: PFC pauses spreading)")  # fmt: skip
    p.candidates = [Candidate(root, round(score, 4)), Candidate(ctx.localizer.host_link(root), round(score / 2, 4))]
    if leaf:
        p.candidates.append(Candidate(leaf, round(score / 4, 4)))
    p.affected = sorted({f.node for f in real_victims})
    ctx.blamed[root] = p.key
    return [p]


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
    for f in ctx.findings:
        if id(f) in ctx.claimed or f.signal not in ROOT_SIGNALS:
            continue
        hca = ctx.hca(f)
        if leaf is not None and ctx.localizer.leaf(hca) != leaf:
            continue
        s = f.value / (f.rule.condition.threshold or 1.0) + (0.5 if hca not in victims else 0.0)
        if s > score:
            best, score = hca, s
    return best, score
