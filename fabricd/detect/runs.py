"""NCCL runs as witnesses of a fabric queue the probes cross too rarely to place it alone.

A collective is as slow as its slowest link, and NCCL spreads a job's traffic over every rail and
ECMP path between its hosts: a run whose hosts' traffic may cross a congested link is slow, one
whose traffic cannot is not. Where a queue sits on a link that only one or two probed pairs cross
(a fabric of two nodes a leaf under four spines: a leaf's uplink to one spine is probed by a pair
or two), the pair guard's three pairs never come; the NCCL runs of the nodes behind the link then
say what the missing pairs would have (``congestion_nccl_*`` params, rules/detection/congestion.yaml).

A run's paths cover all of a leaf's uplinks alike, so runs never choose among them: the slow
pairs name the link, the runs only confirm that a queue is there.
"""

from __future__ import annotations

from fabricd.detect.base import EvalContext
from fabricd.detect.localize import Cluster
from fabricd.model import IncidentKind

# A run over more hosts than this spans most of the fabric: whether it is slow says little about one
# link, and asking each of its host pairs costs the square of its size at every evaluation.
MAX_WITNESS_HOSTS = 16


def confirm_queue(ctx: EvalContext, cluster: Cluster) -> bool:
    """Whether the NCCL runs reported since the cluster's slow pairs began say
    ``cluster.element`` holds a queue: every slow run's traffic may cross it; at least
    ``congestion_nccl_min_runs`` slow runs, and no node in all of them (one node slow with every
    partner is that node's problem, a straggler, whatever its partners' paths); and as large a share
    of the runs across it slow as the pair guard asks of the probed paths through it."""
    pairs = [s.ref for s in cluster.symptoms if s.pair]
    if not pairs:
        return False
    if cluster.element in ctx.open_elements.get(IncidentKind.CONGESTION, ()):
        # Confirmed once, the queue stays while its pairs stay slow: the runs are judged against
        # the fleet's medians, which take in a slowdown that most runs share within minutes
        # (latency.FLEET_RUNS), and a long fault's runs stop looking slow while it lasts.
        return True
    if not ctx.run_hosts:
        return False
    # The runs reported since the probes first saw the queue: earlier ones ran before it (in the
    # simulator the runs of the scrape before a pair's first slow one were still fast).
    since = min(f.started_ts for f in pairs)
    slow_at = ctx.param("congestion_nccl_slow_score", 4.0)
    element = (cluster.element,)
    loc = ctx.localizer
    across = 0
    slow: list[set[str]] = []
    crossing: dict[frozenset[str], bool] = {}  # a job's members report the same run
    for node, runs in ctx.run_hosts.items():
        scores = ctx.run_scores.get(node, {})
        for ts, hosts in runs:
            score = scores.get(ts)
            if ts < since or score is None or len(hosts) > MAX_WITNESS_HOSTS:
                continue
            key = frozenset(hosts)
            crosses = crossing.get(key)
            if crosses is None:
                crosses = crossing[key] = any(loc.may_cross(a, b, element) for a in hosts for b in hosts if a < b)
            if score > slow_at and not crosses:
                return False  # slowness the element does not explain: a second cause, or no queue
            if crosses:
                across += 1
                if score > slow_at:
                    slow.append(hosts)
    if len(slow) < ctx.param("congestion_nccl_min_runs", 3) or set.intersection(*slow):
        return False
    return len(slow) / across >= ctx.param("congestion_rtt_consistency", 0.75)
