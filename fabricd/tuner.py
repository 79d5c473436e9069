"""What NCCL would pick: its tuner's model of ring and tree with the LL, LL128 and Simple protocols.

NCCL does not run one algorithm at every size: for each collective it predicts, per algorithm and
protocol, ``time = latency + bytes / bandwidth`` and takes the fastest (``ncclTopoTuneModel`` and
``ncclTopoGetAlgoTime`` in NVIDIA/nccl ``src/graph/tuning.cc``). Small messages go LL (8-byte
stores with a flag: low latency, a quarter of the bandwidth), mid sizes LL128, large ones Simple;
a tree wins at small sizes on many nodes (log2 of the nodes in latency), a ring at large ones.

The constants are NCCL's (tuning.cc, microseconds): base latencies per algorithm and protocol,
hardware latencies per hop for NVLink and the network, the LL bandwidth caps for several nodes and
the protocol bandwidth factors. What NCCL learns from its topology search (channels, bandwidth per
channel) comes from the fabric here: a ring's bus bandwidth is the node's network bandwidth
(``Fabric.node_bandwidth``), two channels per HCA. Left out: CollNet/NVLS (SHARP, NVLink
SHARP), the tree's size correction factors, user overrides (``NCCL_ALGO``/``NCCL_PROTO``): pass
``--algo`` to force one. Only all_reduce has a tree; the other collectives use the ring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fabricd.perfmodel import Fabric, Prediction, busbw_factor

PROTOCOLS = ("LL", "LL128", "Simple")
BASE_LAT_US = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}
NET_LAT_US = {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0)}
NVLINK_LAT_US = {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4)}
NET_OVERHEAD_US = 1.0  # per inter-node ring step (Intel x86; x3 for Simple)
LL_MAX_BW_GBS = (87.7, 39.0, 20.4)  # LL cap: one node (Hopper), two nodes, more (Intel CPUs)
TREE_MAX_BW_PER_CHANNEL_GBS = (38.7, 41.4, 36.0)  # Hopper, by node count as above
LL128_RING_MAX_PER_CHANNEL_GBS = 36.7


@dataclass(frozen=True, slots=True)
class Choice:
    algo: str
    protocol: str
    time_seconds: float


def _node_index(nodes: int) -> int:
    return 0 if nodes <= 1 else 1 if nodes == 2 else 2


def _steps(op: str, ranks: int, nodes: int) -> tuple[int, int]:
    """(steps, inter-node steps) of a ring, as tuning.cc counts them."""
    if op == "all_reduce":
        return 2 * (ranks - 1), (2 * nodes if nodes > 1 else 0)
    if op in ("all_gather", "reduce_scatter"):
        return ranks - 1, nodes - 1
    return ranks, nodes


def _latency_us(op: str, algo: str, p: int, ranks: int, nodes: int) -> float:
    base = BASE_LAT_US[algo][p]
    intra = NVLINK_LAT_US[algo][p]
    inter = NET_LAT_US[algo][p]
    if algo == "tree":
        return base + 2 * ((ranks // max(nodes, 1) - 1) * intra + int(math.log2(max(nodes, 1))) * inter)
    steps, inter_steps = _steps(op, ranks, nodes)
    if nodes == 1:
        return base + steps * intra
    overhead = NET_OVERHEAD_US * (3 if PROTOCOLS[p] == "Simple" else 1)
    return base + (steps - inter_steps) * max(intra, overhead) + inter_steps * inter


def _bus_bw_gbs(op: str, algo: str, p: int, nodes: int, fabric: Fabric) -> float:
    channels = 2 * fabric.hcas_per_node
    bw = (fabric.node_bandwidth if nodes > 1 else fabric.nvlink_bytes_per_second * fabric.gpus_per_node) / 1e9
    i = _node_index(nodes)
    proto = PROTOCOLS[p]
    if algo == "ring":
        if proto == "LL":
            bw = min(LL_MAX_BW_GBS[i], bw * (1 / 4 if nodes > 1 or op in ("all_reduce", "reduce") else 1 / 3))
        elif proto == "LL128":
            bw = min(bw * 0.92, channels * LL128_RING_MAX_PER_CHANNEL_GBS)
        return bw
    bw = min(bw * 0.92, channels * TREE_MAX_BW_PER_CHANNEL_GBS[i])
    if proto == "LL":
        bw = min(bw / 3.8, LL_MAX_BW_GBS[i])
    elif proto == "LL128":
        bw *= 7 / 9 if nodes == 1 else 120 / 128
    return bw


def time_seconds(op: str, algo: str, protocol: str, size_bytes: int, nodes: int, fabric: Fabric) -> float:
    """One algorithm and protocol: NCCL's ``latency + bytes / algorithm bandwidth``."""
    p = PROTOCOLS.index(protocol)
    ranks = max(nodes * fabric.gpus_per_node, 1)
    bus = _bus_bw_gbs(op, algo, p, nodes, fabric)
    steps, _ = _steps(op, ranks, nodes)
    alg = bus * (ranks / steps if algo == "ring" else 0.5)  # bus -> algorithm bandwidth, as tuning.cc
    latency_us = _latency_us(op, algo, p, ranks, nodes)
    return (latency_us + size_bytes / (1000.0 * alg)) * 1e-6  # GB/s = 1000 bytes/us


def choose(op: str, size_bytes: int, nodes: int, fabric: Fabric) -> Choice:
    """The algorithm and protocol NCCL's tuner would pick, with the time it predicts."""
    algos = ("tree", "ring") if op == "all_reduce" and nodes > 1 else ("ring",)
    options = [Choice(a, p, time_seconds(op, a, p, size_bytes, nodes, fabric)) for a in algos for p in PROTOCOLS]
    return min(options, key=lambda c: c.time_seconds)


def predict_tuned(op: str, size_bytes: int, nodes: int, fabric: Fabric) -> Prediction:
    c = choose(op, size_bytes, nodes, fabric)
    ranks = max(nodes * fabric.gpus_per_node, 1)
    algbw = size_bytes / c.time_seconds if c.time_seconds > 0 else 0.0
    return Prediction(
        op, c.algo, nodes, ranks, size_bytes, c.time_seconds, algbw, algbw * busbw_factor(op, ranks), c.protocol
    )


# NCCL's names of its collectives (ncclFuncToString, as Inspector writes them) -> the model's.
NCCL_OPS = {
    "AllReduce": "all_reduce",
    "AllGather": "all_gather",
    "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast",
    "Reduce": "reduce",
}


def expected(coll: str, size_bytes: float, ranks: int, nodes: int, hcas_per_node: int) -> Choice | None:
    """What NCCL's tuner would expect of one rank's collective (Inspector), on a fabric of the
    model's defaults with the node's HCA count; None when the collective or its shape is unknown."""
    op = NCCL_OPS.get(coll)
    if op is None or ranks < 2 or nodes < 1 or size_bytes <= 0:
        return None
    fabric = Fabric(hcas_per_node=max(hcas_per_node, 1), gpus_per_node=max(ranks // nodes, 1))
    return choose(op, int(size_bytes), nodes, fabric)
