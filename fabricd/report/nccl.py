"""The report's NCCL section: every NCCL-tests row of the window against the model of its own node.

Which model (``ReportQuery.hardware``):

- ``nodes`` (the default): each node's own fabric ports as its agent read them from sysfs and the
  central stored them (``link_rate``, ``port_state``, ``port_info`` of source ``infiniband``), chosen
  by the agent's rule (``fabricd.derived.fabric_ports``: the active InfiniBand ports, else the active
  Ethernet ones, at the highest rate); the job's shape (``nodes``, ``ranks``) and the model's
  ``algo`` and ``model_efficiency`` as the run reported them (collectors/nccl.py). This is the model
  the agent's own ``nccl_efficiency`` used, so the report and the agent agree. What a node or run
  does not say comes from the query's fabric (the flags' defaults), and the section says so.
- ``flags``: the query's fabric and ``nccl_nodes`` for every run (``fabricd report --link-rate ...``).

Runs whose models are equal share a curve; the curve names its model and the nodes it covers.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from fabricd.derived import fabric_ports
from fabricd.model import Kind, Reading
from fabricd.perfmodel import ALGOS, GBIT, OPS, Fabric, predict
from fabricd.report.data import NcclCurve, ReportData
from fabricd.report.source import Source

PORT_SERIES = ("link_rate", "port_state", "port_info")


@dataclass(frozen=True)
class RunModel:
    """What one run is compared against, and where each part of it came from."""

    fabric: Fabric
    nodes: int
    algo: str
    hardware: str  # "sysfs", "flags" or "default" (no port rates stored for the node)

    def describe(self) -> str:
        f = self.fabric
        source = {"sysfs": "from each node's sysfs", "flags": "from the flags", "default": "the default"}
        return (
            f"{f.hcas_per_node} × {f.link_rate_bytes_per_second / GBIT:g} Gb/s per node ({source[self.hardware]}), "
            f"jobs of {self.nodes} nodes × {f.gpus_per_node} GPUs, {self.algo}, efficiency {f.efficiency:g}"
        )


def node_ports(src: Source, node: str, data: ReportData) -> tuple[int, float] | None:
    """(active fabric ports, link rate in bytes/s) of ``node`` at the end of the window, as stored."""
    readings = []
    for name in PORT_SERIES:
        rows = src.get(
            "series",
            node=node,
            source="infiniband",
            counter=name,
            since=repr(data.window.start),
            until=repr(data.window.end),
        )
        for s in rows:
            if s["points"]:
                kind = Kind(s["kind"])
                labels = tuple(sorted(s["labels"].items()))
                value = float(s["points"][-1]["value"])
                readings.append(
                    Reading(
                        "infiniband", s["device"], s["port"], s["counter"], value, s["unit"], kind, labels, s["name"]
                    )
                )
    return fabric_ports(readings)


def run_model(query: Any, ports: tuple[int, float] | None, job: dict[str, float]) -> RunModel:
    base = query.fabric
    if query.hardware == "flags":
        return RunModel(base, query.nccl_nodes, "ring", "flags")
    nodes = int(job.get("nodes", query.nccl_nodes))
    ranks = int(job.get("ranks", nodes * base.gpus_per_node))
    fabric = replace(
        base,
        gpus_per_node=max(ranks // max(nodes, 1), 1),
        efficiency=float(job.get("model_efficiency", base.efficiency)),
    )
    if ports is not None:
        fabric = replace(fabric, hcas_per_node=ports[0], link_rate_bytes_per_second=ports[1])
    algo = str(job.get("algo", "ring"))
    return RunModel(fabric, nodes, algo if algo in ALGOS else "ring", "sysfs" if ports is not None else "default")


def _jobs(runs: list[dict[str, Any]]) -> dict[tuple[str, str, float], dict[str, Any]]:
    """(node, op, ts) -> the run's shape and model gauges (the rows without a size)."""
    jobs: dict[tuple[str, str, float], dict[str, Any]] = {}
    for run in runs:
        if "size" in run["labels"]:
            continue
        job = jobs.setdefault((run["node"], run["op"], run["ts"]), {})
        for name in ("nodes", "ranks", "model_efficiency"):
            if name in run["values"]:
                job[name] = run["values"][name]
        if "algo" in run["labels"]:
            job["algo"] = run["labels"]["algo"]
    return jobs


def nccl_curves(src: Source, data: ReportData) -> list[NcclCurve]:
    """Out-of-place busbw of every NCCL-tests row in the window, per collective, size and model."""
    runs = [r for r in src.get("nccl", since=repr(data.window.start), limit=10_000) if r["ts"] <= data.window.end]
    jobs = _jobs(runs)
    ports: dict[str, tuple[int, float] | None] = {}
    measured: dict[tuple[str, RunModel], dict[int, list[float]]] = {}
    covered: dict[tuple[str, RunModel], set[str]] = {}
    for run in runs:
        busbw = run["values"].get("busbw_bytes_per_second")
        labels = run["labels"]
        if busbw is None or run["op"] not in OPS or labels.get("placement") != "out_of_place" or "size" not in labels:
            continue
        if data.query.hardware == "nodes" and run["node"] not in ports:
            ports[run["node"]] = node_ports(src, run["node"], data)
        model = run_model(data.query, ports.get(run["node"]), jobs.get((run["node"], run["op"], run["ts"]), {}))
        key = (run["op"], model)
        measured.setdefault(key, {}).setdefault(int(labels["size"]), []).append(float(busbw))
        covered.setdefault(key, set()).add(run["node"])
    return _curves(measured, covered)


def _curves(
    measured: dict[tuple[str, RunModel], dict[int, list[float]]], covered: dict[tuple[str, RunModel], set[str]]
) -> list[NcclCurve]:
    curves: list[NcclCurve] = []
    seen: dict[str, int] = {}
    for (op, model), per_size in sorted(measured.items(), key=lambda kv: (kv[0][0], sorted(covered[kv[0]]))):
        sizes = sorted(s for s in per_size if s > 0)
        predicted = [predict(op, s, model.nodes, model.fabric, model.algo).busbw_bytes_per_second for s in sizes]
        seen[op] = seen.get(op, 0) + 1
        name = f"nccl-{op}" if seen[op] == 1 else f"nccl-{op}-{seen[op]}"
        nodes = sorted(covered[(op, model)])
        curves.append(NcclCurve(op, sizes, [per_size[s] for s in sizes], predicted, model.describe(), nodes, name))
    return curves


def median_busbw(curve: NcclCurve) -> list[float]:
    return [statistics.median(m) for m in curve.measured]


def efficiencies(curve: NcclCurve) -> list[float | None]:
    """Measured median ÷ predicted busbw, per size (what the agent's nccl_efficiency is at the largest)."""
    return [m / p if p > 0 else None for m, p in zip(median_busbw(curve), curve.predicted, strict=True)]
