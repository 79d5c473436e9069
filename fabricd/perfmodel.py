"""An alpha-beta (latency-bandwidth) model of the collectives NCCL tests measure (docs/model.md).

    T(n) = steps(op, algo, p, N) * alpha  +  bytes_on_bottleneck(op, algo, n, p, N) / B

``alpha`` is the per-step latency; ``B`` the bandwidth of the bottleneck the data crosses: the
node's network injection bandwidth ``hcas_per_node * link_rate * efficiency`` (reduced by
leaf->spine oversubscription for the part of the traffic that leaves a leaf) for multi-node jobs,
NVLink for single-node jobs. Bus bandwidth follows the NCCL-tests conventions (PERFORMANCE.md in
NVIDIA/nccl-tests): busbw = algbw * 2(n-1)/n for all_reduce, (n-1)/n for all_gather,
reduce_scatter and alltoall, 1 for broadcast, reduce and sendrecv, where n is the rank count.

Calibration fits ``alpha`` on small messages and ``efficiency`` (the achievable fraction of line
rate) on large ones, from healthy NCCL-tests runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv", "broadcast", "reduce")
ALGOS = ("ring", "tree")
GBIT = 1e9 / 8  # bytes/s in one Gb/s


@dataclass(frozen=True)
class Fabric:
    """What the model needs of the topology (from sysfs ``rate``, the topology file, or flags)."""

    link_rate_bytes_per_second: float = 400 * GBIT  # per HCA port (sysfs rate × 125,000,000)
    hcas_per_node: int = 8
    gpus_per_node: int = 8
    nodes_per_leaf: int = 16
    oversubscription: float = 1.0  # leaf downlink capacity ÷ uplink capacity (1 = non-blocking)
    nvlink_bytes_per_second: float = 450e9  # per-GPU intra-node bandwidth (H100 NVLink4, one direction)
    alpha_seconds: float = 8e-6  # per-step latency of the network path
    efficiency: float = 0.9  # achievable fraction of line rate (calibrated)

    @property
    def node_bandwidth(self) -> float:
        return self.hcas_per_node * self.link_rate_bytes_per_second * self.efficiency


@dataclass(frozen=True)
class Prediction:
    op: str
    algo: str
    nodes: int
    ranks: int
    size_bytes: int
    time_seconds: float
    algbw_bytes_per_second: float
    busbw_bytes_per_second: float
    protocol: str = ""  # LL, LL128 or Simple when NCCL's tuner model chose (fabricd.tuner); "" otherwise


def busbw_factor(op: str, ranks: int) -> float:
    """NCCL-tests' algbw -> busbw factor (nccl-tests PERFORMANCE.md)."""
    n = ranks
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")


def _steps(op: str, algo: str, ranks: int) -> float:
    """Latency steps: ring ops take p-1 steps per phase, trees log2(p) per phase."""
    p = max(ranks, 1)
    depth = math.ceil(math.log2(p)) if p > 1 else 0
    if op == "all_reduce":
        return 2 * depth if algo == "tree" else 2 * (p - 1)
    if op in ("broadcast", "reduce"):
        return depth if algo == "tree" else p - 1
    if op == "sendrecv":
        return 1
    return p - 1  # all_gather, reduce_scatter, alltoall: ring / pairwise exchange


def _network_bytes_per_node(op: str, algo: str, size: int, ranks: int, nodes: int) -> float:
    """Bytes each node must push through its NICs (one direction) for a buffer of ``size`` bytes.

    Ring all_reduce: every rank's ring edge carries 2(p-1)/p of the buffer, and a node's outbound
    edges sum to that much per node. Hierarchical tree all_reduce reduces inside the node over
    NVLink first, so only 2(N-1)/N of the buffer crosses the network per node.
    """
    p, n_nodes = ranks, nodes
    if op == "all_reduce":
        return 2 * (n_nodes - 1) / n_nodes * size if algo == "tree" else 2 * (p - 1) / p * size
    if op in ("all_gather", "reduce_scatter"):
        # nccl-tests' size is the full gathered buffer; each node sends its share to every other node.
        return (n_nodes - 1) / n_nodes * size
    if op == "alltoall":
        return (n_nodes - 1) / n_nodes * size
    return float(size)  # broadcast, reduce, sendrecv: the buffer crosses once (pipelined)


def _cross_leaf_share(op: str, nodes: int, fabric: Fabric) -> float:
    """Fraction of a node's network traffic that leaves its leaf, for the most loaded leaf."""
    if nodes <= fabric.nodes_per_leaf:
        return 0.0
    if op == "alltoall":
        return (nodes - fabric.nodes_per_leaf) / (nodes - 1)
    # Ring/tree orderings keep neighbours on the same leaf: only the boundary node of each leaf
    # sends upward, one node's worth of traffic per leaf.
    return 1.0 / fabric.nodes_per_leaf


def _network_bandwidth(op: str, nodes: int, fabric: Fabric) -> float:
    share = _cross_leaf_share(op, nodes, fabric)
    if share == 0.0 or fabric.oversubscription <= 1.0:
        return fabric.node_bandwidth
    # Leaf uplinks carry share × (all nodes on the leaf) at 1/oversubscription of downlink capacity.
    uplink_per_node = fabric.node_bandwidth / fabric.oversubscription
    return min(fabric.node_bandwidth, uplink_per_node / share)


def predict(op: str, size_bytes: int, nodes: int, fabric: Fabric, algo: str = "ring") -> Prediction:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; known: {', '.join(ALGOS)}")
    ranks = max(nodes * fabric.gpus_per_node, 1)
    steps = _steps(op, algo, ranks)
    if nodes > 1:
        bw_time = _network_bytes_per_node(op, algo, size_bytes, ranks, nodes) / _network_bandwidth(op, nodes, fabric)
        alpha = fabric.alpha_seconds
    else:  # single node: NVLink only; the same byte counts with nodes -> GPUs
        bw_time = _network_bytes_per_node(op, "ring", size_bytes, ranks, ranks) / fabric.nvlink_bytes_per_second
        alpha = fabric.alpha_seconds / 4  # NVLink hops are several times cheaper than network hops
    t = steps * alpha + bw_time
    algbw = size_bytes / t if t > 0 else 0.0
    return Prediction(op, algo, nodes, ranks, size_bytes, t, algbw, algbw * busbw_factor(op, ranks))


def sizes_range(spec: str) -> list[int]:
    """``8:8G`` -> 8, 16, ..., 8 GiB (factor 2, like nccl-tests ``-b 8 -e 8G -f 2``); ``1M,4M`` lists."""
    if ":" not in spec:
        return [parse_size(s) for s in spec.split(",") if s]
    lo, hi = (parse_size(s) for s in spec.split(":", 1))
    if lo <= 0 or hi < lo:
        raise ValueError(f"bad size range {spec!r}")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def parse_size(text: str) -> int:
    """``8``, ``64K``, ``1M``, ``8G`` (binary multiples, as nccl-tests parses -b/-e)."""
    text = text.strip().upper().removesuffix("B")
    mult = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(text[-1:], 1)
    number = text[:-1] if mult > 1 else text
    try:
        return int(float(number) * mult)
    except ValueError as exc:
        raise ValueError(f"bad size {text!r}: use e.g. 8, 64K, 1M, 8G") from exc


def parse_rate(text: str) -> float:
    """``400G``/``400Gb/s``/``400 Gb/sec (4X NDR)`` -> bytes/s (Gb/s × 125,000,000, as sysfs rate)."""
    parts = text.strip().split()
    if not parts:
        raise ValueError("empty link rate: use e.g. 400G or '400 Gb/sec (4X NDR)'")
    head = parts[0].upper()
    head = head.removesuffix("/S").removesuffix("/SEC").removesuffix("B").removesuffix("G")
    try:
        return float(head) * GBIT
    except ValueError as exc:
        raise ValueError(f"bad link rate {text!r}: use e.g. 400G or '400 Gb/sec (4X NDR)'") from exc


# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Observation:
    """One healthy measurement: op, nodes, size and the measured time."""

    op: str
    nodes: int
    size_bytes: int
    time_seconds: float
    algo: str = "ring"


@dataclass(frozen=True)
class Calibration:
    alpha_seconds: float
    efficiency: float
    observations: int
    latency_rows: int  # small messages that set alpha
    bandwidth_rows: int  # large messages that set the efficiency
    median_relative_error: float  # over the rows used, after fitting


# Regimes of the fit: below SMALL the latency term dominates (a few hundred bytes per rank), above
# LARGE the bandwidth term does. In between NCCL switches protocols (LL, LL128, Simple) and pipelines
# fill, which an alpha-beta model does not describe; those rows inform neither parameter.
SMALL_BYTES = 64 * 1024
LARGE_BYTES = 1024 * 1024 * 1024


def calibrate(observations: Sequence[Observation], fabric: Fabric) -> Calibration:
    """Fit alpha on small messages and the efficiency on large ones (medians: robust to outliers)."""
    import statistics

    small = [o for o in observations if o.size_bytes <= SMALL_BYTES]
    large = [o for o in observations if o.size_bytes >= LARGE_BYTES]
    if not large:
        raise ValueError(f"calibration needs healthy runs with messages of at least {LARGE_BYTES >> 20} MiB")
    alpha = fabric.alpha_seconds
    if small:
        alpha = statistics.median(o.time_seconds / _alpha_steps(o, fabric) for o in small)
    line = replace(fabric, efficiency=1.0, alpha_seconds=0.0)
    effs = []
    for o in large:
        ideal = predict(o.op, o.size_bytes, o.nodes, line, o.algo).time_seconds
        effs.append(ideal / max(o.time_seconds - alpha * _alpha_steps(o, fabric), 1e-12))
    fitted = replace(fabric, alpha_seconds=alpha, efficiency=min(statistics.median(effs), 1.0))
    used = small + large
    errors = [abs(predict(o.op, o.size_bytes, o.nodes, fitted, o.algo).time_seconds / o.time_seconds - 1) for o in used]
    return Calibration(alpha, fitted.efficiency, len(observations), len(small), len(large), statistics.median(errors))


def _alpha_steps(o: Observation, fabric: Fabric) -> float:
    steps = _steps(o.op, o.algo, o.nodes * fabric.gpus_per_node)
    return max(steps * (1.0 if o.nodes > 1 else 0.25), 1e-9)


def efficiency(measured_busbw: float, predicted_busbw: float) -> float:
    """measured ÷ predicted bus bandwidth; what the detectors watch for sustained drops."""
    return measured_busbw / predicted_busbw if predicted_busbw > 0 else 0.0


def observations_from_run(run: object, nodes: int, algo: str = "ring", op: str = "") -> list[Observation]:
    """Healthy out-of-place rows of a parsed NCCL-tests run (``fabricd.parsers.nccl.NcclRun``).

    ``op`` overrides the run's own (logs cut out of a larger file often lack the binary name)."""
    op = op or str(getattr(run, "op", ""))
    if op not in OPS:
        raise ValueError(f"cannot tell the collective of this run ({op!r}); name it explicitly")
    return [
        Observation(op, nodes, row.size_bytes, row.time_seconds, algo)
        for row in getattr(run, "rows", ())
        if row.placement == "out_of_place" and row.time_seconds and row.size_bytes > 0 and not row.wrong
    ]
