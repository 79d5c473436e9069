"""Host jitter on simulated probe RTTs: what a loaded host adds to every pingmesh probe.

A real probe's RTT is the path (wire, switches, queues) plus both hosts: the sender's and the
responder's kernels, softirqs and event loops. On a busy host that part dwarfs a fabric queue:
measured here on loopback UDP (bench/rtt_jitter.py, docs/detection.md "Measured jitter"), the
minimum of a scrape's probes sits near 150-180 us and is steady (pair-to-pair spread ~40 us), the
median is 0.3-0.5 ms and the p99 3-4 ms, set by the few probes a scheduling stall catches.

``jittered`` turns the path model's per-scrape RTT summary into what the pingmesh collector would
report: each quantile of the host part is drawn from a lognormal around the host's current level
(a host's load moves between scrapes), a few probes per hundred hit a stall (they set p99 and max
once there are enough of them), and the minimum keeps its floor. Quantiles are drawn, not
computed from every probe: an hour of 256 nodes would otherwise draw tens of millions of RTTs.
"""

from __future__ import annotations

import functools
import math
import random
from statistics import NormalDist

from fabricd.sim.scenario import HostJitterSpec

# standard-normal quantiles of the summary's points
Z_P50, Z_P90, Z_P99 = 0.0, 1.2816, 2.3263
SAMPLING_SPREAD = 0.08  # relative noise of an estimated quantile over ~100 probes


@functools.lru_cache(maxsize=256)
def z_min(count: int) -> float:
    """Expected standard-normal minimum of ``count`` draws (Blom's plotting position)."""
    if count <= 1:
        return 0.0
    return NormalDist().inv_cdf((1 - 0.375) / (count + 0.25))


def jittered(
    path: tuple[float, float, float, float, float],
    count: int,
    spec: HostJitterSpec,
    pair_offset: float,
    host_level: float,
    rng: random.Random,
) -> tuple[float, float, float, float, float]:
    """(min, p50, p90, p99, max) of ``count`` probes: the path's plus both hosts' share.
    ``host_level`` is the prober's load factor this scrape (``host_level()``): shared by all its pairs."""
    if spec.probe_median_seconds <= 0 or count <= 0:
        return path
    level = spec.probe_median_seconds * pair_offset * host_level
    body = max(0.0, level - spec.floor_seconds)
    sigma = spec.probe_spread

    def host(z: float) -> float:
        return spec.floor_seconds + body * math.exp(sigma * z + rng.gauss(0.0, SAMPLING_SPREAD))

    lo, p50, p90, p99 = host(z_min(count)), host(Z_P50), host(Z_P90), host(Z_P99)
    top = host(Z_P99 + 0.5)
    stalls = _stalls(count, spec.spike_rate, rng)
    if stalls:
        spike = spec.spike_median_seconds * math.exp(rng.gauss(0.0, 0.4))
        top = max(top, spike)
        if stalls >= max(1, math.ceil(0.01 * count)):
            p99 = max(p99, spike * math.exp(-0.2 * rng.random()))
        if stalls >= max(1, math.ceil(0.1 * count)):
            p90 = max(p90, spike * 0.5)
    m, q50, q90, q99, mx = path
    total = (m + lo, q50 + p50, q90 + p90, q99 + p99, mx + top)
    out = [total[0]]
    for v in total[1:]:
        out.append(max(v, out[-1]))  # quantiles stay ordered
    return (out[0], out[1], out[2], out[3], out[4])


def host_level(spec: HostJitterSpec, rng: random.Random) -> float:
    """A host's load factor over one scrape: every pair it probes sees it (the common mode)."""
    return math.exp(rng.gauss(0.0, spec.level_spread))


def pair_offset(spec: HostJitterSpec, rng: random.Random) -> float:
    """A pair's fixed share of host cost (NUMA placement, IRQ affinity): drawn once per pair."""
    return math.exp(rng.gauss(0.0, spec.pair_spread))


def _stalls(n: int, p: float, rng: random.Random) -> int:
    """Probes out of ``n`` a stall catches: Poisson(n p), by multiplication (n p is a few)."""
    lam = n * p
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, min(n, round(rng.gauss(lam, math.sqrt(lam)))))
    limit, k, prod = math.exp(-lam), 0, rng.random()
    while prod > limit:
        k += 1
        prod *= rng.random()
    return min(k, n)
