"""``fabricd model``: what each collective ought to take on this fabric (docs/model.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import yaml

from fabricd.perfmodel import ALGOS, OPS, Calibration, Fabric, parse_rate


def register(sub: Any) -> None:
    p = sub.add_parser(
        "model",
        help="predict collective time and bus bandwidth on a fabric (alpha-beta model)",
        description="Predict NCCL-tests time, algbw and busbw per message size and scale from an "
        "alpha-beta model of the fabric; calibrate it on healthy NCCL-tests logs; what-ifs with more "
        "nodes, another link rate or oversubscription. Formulas: docs/model.md.",
    )
    p.add_argument(
        "--topology",
        type=Path,
        metavar="FILE",
        help="YAML with a 'topology' mapping (a scenario file works): hcas_per_node, "
        "nodes_per_leaf, link_rate, gpus_per_node, oversubscription",
    )
    p.add_argument(
        "--sysfs-root",
        type=Path,
        metavar="DIR",
        help="read HCA count and link rate of this node from sysfs (class/infiniband)",
    )
    p.add_argument("--link-rate", metavar="RATE", help="per-HCA link rate, e.g. 400G (default 400G)")
    p.add_argument("--hcas-per-node", type=int, metavar="N", help="network ports per node (default 8)")
    p.add_argument("--gpus-per-node", type=int, metavar="N", help="ranks per node (default 8)")
    p.add_argument("--nodes-per-leaf", type=int, metavar="N", help="nodes under one leaf switch (default 16)")
    p.add_argument("--oversubscription", type=float, metavar="X", help="leaf down:up capacity ratio (default 1)")
    p.add_argument("--nvlink", type=float, metavar="GBPS", help="per-GPU NVLink bandwidth, GB/s (default 450)")
    p.add_argument("--alpha-us", type=float, metavar="US", help="per-step latency, microseconds (default 8)")
    p.add_argument("--efficiency", type=float, metavar="F", help="achievable fraction of line rate (default 0.9)")
    p.add_argument("--op", choices=OPS, default="all_reduce", help="collective (default all_reduce)")
    p.add_argument(
        "--algo",
        choices=(*ALGOS, "auto"),
        default="auto",
        help="algorithm; auto (default): what NCCL's tuner picks per size, ring or tree with LL, LL128 or "
        "Simple (fabricd/tuner.py), and says which",
    )
    p.add_argument("--nodes", default="2", metavar="N,N,...", help="node counts, e.g. 16,32,64,128 (default 2)")
    p.add_argument(
        "--sizes",
        default="8:8G",
        metavar="LO:HI|S,S",
        help="message sizes: a factor-2 range like 8:8G, or a list 1M,1G (default 8:8G)",
    )
    p.add_argument(
        "--calibrate",
        type=Path,
        action="append",
        metavar="LOG",
        help="healthy NCCL-tests log to fit alpha and efficiency on (repeatable)",
    )
    p.add_argument(
        "--calibrate-nodes",
        type=int,
        metavar="N",
        help="node count of the calibration logs (default: hosts listed in the log)",
    )
    p.add_argument(
        "--calibrate-algo", choices=ALGOS, help="algorithm of the calibration logs (default --algo; ring for auto)"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def _from_topology(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) or {}
    topo = data.get("topology", data)
    if not isinstance(topo, dict):
        raise ValueError(f"{path}: 'topology' must be a mapping")
    out: dict[str, Any] = {}
    for key in ("hcas_per_node", "gpus_per_node", "nodes_per_leaf"):
        if key in topo:
            out[key] = int(topo[key])
    if "oversubscription" in topo:
        out["oversubscription"] = float(topo["oversubscription"])
    if "link_rate" in topo:
        out["link_rate_bytes_per_second"] = parse_rate(str(topo["link_rate"]))
    return out


def _from_sysfs(root: Path) -> dict[str, Any]:
    """HCA count and link rate from the node's own sysfs, read by the infiniband collector."""
    from collectors.infiniband import InfinibandCollector
    from fabricd.collector import CollectorContext
    from fabricd.derived import fabric_ports

    readings = asyncio.run(InfinibandCollector(CollectorContext(node="model", sysfs_root=root)).collect())
    found = fabric_ports(readings)  # the same rule the agent's NCCL efficiency uses
    if found is None:
        raise ValueError(f"{root}: no active InfiniBand/RoCE port with a rate")
    hcas, rate = found
    return {"hcas_per_node": hcas, "link_rate_bytes_per_second": rate}


def build_fabric(args: argparse.Namespace) -> Fabric:
    values: dict[str, Any] = {}
    if args.topology:
        values.update(_from_topology(args.topology))
    if args.sysfs_root:
        values.update(_from_sysfs(args.sysfs_root))
    flags = {
        "link_rate_bytes_per_second": parse_rate(args.link_rate) if args.link_rate else None,
        "hcas_per_node": args.hcas_per_node,
        "gpus_per_node": args.gpus_per_node,
        "nodes_per_leaf": args.nodes_per_leaf,
        "oversubscription": args.oversubscription,
        "nvlink_bytes_per_second": args.nvlink * 1e9 if args.nvlink else None,
        "alpha_seconds": args.alpha_us * 1e-6 if args.alpha_us is not None else None,
        "efficiency": args.efficiency,
    }
    values.update({k: v for k, v in flags.items() if v is not None})
    return Fabric(**values)


def _calibrate(args: argparse.Namespace, fabric: Fabric) -> Calibration:
    from fabricd.parsers.nccl import parse_nccl_output
    from fabricd.perfmodel import calibrate, observations_from_run

    observations = []
    algo = args.calibrate_algo or (args.algo if args.algo != "auto" else "ring")
    for log in args.calibrate:
        run_ = parse_nccl_output(log.read_text(errors="replace"))
        if not run_.rows:
            raise ValueError(f"{log}: not NCCL-tests output (no result table with size, time and busbw columns)")
        nodes = args.calibrate_nodes or len({r.host for r in run_.ranks}) or 1
        observations += observations_from_run(run_, nodes, algo, op=args.op)
    return calibrate(observations, fabric)


def run(args: argparse.Namespace) -> int:
    from fabricd.perfmodel import predict, sizes_range

    try:
        fabric = build_fabric(args)
        nodes = [int(n) for n in args.nodes.split(",") if n]
        sizes = sizes_range(args.sizes)
        calibration = _calibrate(args, fabric) if args.calibrate else None
    except (ValueError, OSError) as exc:
        print(f"fabricd model: {exc}", file=sys.stderr)
        return 2
    if calibration:
        fabric = replace(fabric, alpha_seconds=calibration.alpha_seconds, efficiency=calibration.efficiency)
    if args.algo == "auto":
        from fabricd.tuner import predict_tuned

        preds = [predict_tuned(args.op, s, n, fabric) for n in nodes for s in sizes]
    else:
        preds = [predict(args.op, s, n, fabric, args.algo) for n in nodes for s in sizes]
    if args.json:
        out = {
            "fabric": asdict(fabric),
            "calibration": asdict(calibration) if calibration else None,
            "predictions": [asdict(p) for p in preds],
        }
        print(json.dumps(out, indent=2))
        return 0
    _print_table(preds, fabric, calibration)
    return 0


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.4g} {unit}"
        n /= 1024
    return f"{n}"


def _print_table(preds: list[Any], fabric: Fabric, calibration: Calibration | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    console.print(
        f"fabric: {fabric.hcas_per_node} x {fabric.link_rate_bytes_per_second * 8 / 1e9:g} Gb/s per node, "
        f"{fabric.gpus_per_node} ranks/node, {fabric.nodes_per_leaf} nodes/leaf, oversubscription "
        f"{fabric.oversubscription:g}, alpha {fabric.alpha_seconds * 1e6:.2f} us, efficiency "
        f"{fabric.efficiency:.3f}"
    )
    if calibration:
        console.print(
            f"calibrated on {calibration.observations} rows ({calibration.latency_rows} latency, "
            f"{calibration.bandwidth_rows} bandwidth): median error {calibration.median_relative_error:.1%}"
        )
    table = Table("op", "algo", "proto", "nodes", "ranks", "size", "time", "algbw GB/s", "busbw GB/s")
    for p in preds:
        t = p.time_seconds
        table.add_row(
            p.op,
            p.algo,
            p.protocol or "-",
            str(p.nodes),
            str(p.ranks),
            _human_bytes(p.size_bytes),
            f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms",
            f"{p.algbw_bytes_per_second / 1e9:.2f}",
            f"{p.busbw_bytes_per_second / 1e9:.2f}",
        )
    console.print(table)
