"""A host's own link blamed on lost probes alone must show on the host's pairs below its leaf.

A lossy host link drops the probes of every pair through it alike: those to the hosts on its own
leaf (which never leave the leaf) as much as those to other leaves. A lossy uplink of the leaf
drops only the second kind. Without path traces the two look the same from the pairs beyond the
leaf. The kernel hashes each pair's probes onto one spine, so a host whose pairs mostly hashed
onto the lossy uplink's spine sees most of its pairs to other leaves lose, and every one of them
crosses its own link. At a fault's onset those pairs are also the first to fire (the other pairs'
windows do not yet hold two lost probes), so the host's link scored first in the greedy cover,
a little over the leaf.

Measured: a routed-lab CI run (``tests/test_leafspine_lab.py``, loss on ``ib-leaf-4~ib-spine-2``,
untraced) opened ``gpu-b01/eth0~ib-leaf-4`` beside ``ib-leaf-4`` ("one of its uplinks"). That
was 11 pairs at 1.4 %: 10 of its 16 pairs to other leaves, and 1 of its 6 pairs below the leaf
(``gpu-b01|gpu-b02``, which crosses no fault: most likely a saturated machine's stray lost probe).
The host link passed the guard on all 22 at exactly half.

So the host's pairs below the leaf are judged on their own, when at least ``min_pairs`` of them
are probed. Such a cluster is set aside when both hold:

* they would not elect the link by the guard's own measure: fewer than ``min_pairs`` of them are
  lossy, or under ``min_consistency`` of them;
* and they are too few for the link to be the loss. Were it, each of them would fire as often as
  the host's pairs beyond the leaf do (their share ``q``), and so few lossy ones of those probed
  would be a chance under ``SIGNIFICANCE`` (the binomial tail). The lab's case: 1 of 6 at
  ``q`` = 10/16 is a 3.1 % chance.

A real lossy host link fails that test as rarely as the significance says. Its pairs fire in the
same minute wherever they go, and a test it failed holds it for a scrape. Loss beyond the leaf
fails it, and the host's pairs go to the leaf's uplinks as the other pairs fire.

Simulated in the lab's shape, untraced, 40 draws in each of 4 settings (an uplink losing 2-5 % of
probes, with one host's pairs hashed onto it with probability 0.8-1.0; ``tests/test_detect_loss.py``
has one draw). That host's link opened beside the leaf in 4 of the 160 draws before, and in none
since. A lossy host link (1, 2 and 5 % probe loss, 30 draws each) opened in the same scrape as
before in 84 of the 90 draws, and 1-7 scrapes later in the other 6 (4 of them at 1 %).

The 1 % of ``background.py`` would keep the lab's case: a host has few pairs below its leaf (3
peers both ways there), and at the guard's half, 1 lossy of 6 is no rarer than 3 %.

A host with fewer pairs below its leaf (alone on it, a sparse pingmesh) is judged as before:
nothing in its pairs tells the two apart. Port counters (symbol errors, discards) place a host
link on their own; this is only for clusters of pairs alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from fabricd.detect.background import binomial_tail
from fabricd.detect.base import EvalContext
from fabricd.detect.localize import Cluster, Symptom

HOST_SIDE = frozenset({"host_link", "hca"})
SIGNIFICANCE = 0.05  # the default of ``loss_below_leaf_significance`` (rules/detection/loss.yaml)


def beyond_leaf(
    ctx: EvalContext, min_pairs: int, min_consistency: float, c: Cluster, healthy: Sequence[Symptom]
) -> bool:
    """A ``PairGuard`` veto: ``c``, a host link or HCA port blamed on lost probes alone, is not
    what its host's pairs below the leaf say (the module's doc)."""
    if c.kind not in HOST_SIDE or not c.symptoms or not all(s.pair for s in c.symptoms):
        return False
    loc = ctx.localizer
    found = loc.element(c.element)
    hca = found.ends[0] if found is not None and c.kind == "host_link" and found.ends else c.element
    link, leaf = loc.host_link(hca), loc.leaf(hca)
    uplinks = frozenset(loc.fabric_links(leaf)) if leaf else frozenset()
    if not uplinks:
        return False  # no leaf known: nothing is beyond it

    def through(s: Symptom) -> bool:
        return s.pair and link in s.certain()

    def below(s: Symptom) -> bool:
        return not any(uplinks & alt for alt in s.alternatives)

    lossy = [below(s) for s in c.symptoms if through(s)]
    fine = [below(s) for s in healthy if through(s)]
    k, n = sum(lossy), sum(lossy) + sum(fine)
    if n < min_pairs or (k >= min_pairs and k >= min_consistency * n):
        return False  # too few to say, or they elect it themselves
    beyond = len(lossy) - k
    share = beyond / (beyond + len(fine) - sum(fine)) if beyond else 0.0
    significance = ctx.param("loss_below_leaf_significance", SIGNIFICANCE)
    return 1.0 - binomial_tail(k + 1, n, share) < significance
