"""Samples from the real collectors on the fixture trees and real local things, for the catalogue tests.

Each collector runs twice over its input (the second time with every counter advanced), through the
agent's ``ScrapePipeline`` (``RateEngine``, then the derived signals), so counters, rates, saturation flags, derived signals, gauges,
infos and events all appear as production would emit them.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collectors import REGISTRY
from collectors.pingmesh import PingmeshCollector
from fabricd.collector import build, close_collectors
from fabricd.model import Reading, Sample
from fabricd.pipeline import ScrapePipeline
from fabricd.sim.sysfstree import (
    MLX5_CONG_COUNTERS,
    MLX5_Q_COUNTERS,
    PORT_COUNTERS_BASE,
    PORT_COUNTERS_DATA,
    DeviceTree,
    PortTree,
    write_infiniband_tree,
)
from tests.helpers import CASES

NODE = "node-001"
IB_TREES = ("procfs", "node_exporter", "gpud-h100", "bnxt_re-kernel-names")


def _bump_counters(root: Path, by: int) -> None:
    """Advance every numeric counter file, as traffic would (saturated all-ones values stay put)."""
    for path in root.rglob("*"):
        if path.is_file() and path.parent.name in {"counters", "counters_ext", "hw_counters"}:
            text = path.read_text().strip()
            if text.isdigit() and int(text) not in {2**4 - 1, 2**8 - 1, 2**16 - 1, 2**32 - 1, 2**64 - 1}:
                path.write_text(f"{int(text) + by}\n")


async def _twice(
    name: str,
    options: dict[str, Any],
    advance: Any,
    *,
    sysfs_root: Path = Path("/sys"),
) -> list[Sample]:
    collector = build(name, options, node=NODE, sysfs_root=sysfs_root, registry=REGISTRY)
    pipeline = ScrapePipeline()
    samples: list[Sample] = []
    try:
        for i, ts in enumerate((1_700_000_000.0, 1_700_000_010.0)):
            if i:
                await advance()
            readings: Sequence[Reading] = await collector.collect()
            samples += pipeline.samples(ts, readings)  # a run parsed once (NCCL logs) shows in one scrape only
    finally:
        await close_collectors([collector])
    return samples


def roce_tree(root: Path) -> None:
    """A RoCE port with the mlx5 congestion counters (none of the captured trees has np_*/rp_*)."""
    hw = {name: 1000 for name in (*MLX5_Q_COUNTERS, *MLX5_CONG_COUNTERS)}
    counters = {name: 5000 for name in (*PORT_COUNTERS_DATA, *PORT_COUNTERS_BASE)}
    port = PortTree(link_layer="Ethernet", rate="200 Gb/sec (2X NDR)", counters=counters, hw_counters=hw)
    write_infiniband_tree(root, {"mlx5_0": DeviceTree(ports={"1": port})})


async def infiniband_samples(tmp: Path) -> list[Sample]:
    out: list[Sample] = []
    for tree in (*IB_TREES, "roce"):
        root = tmp / "ib" / tree
        if tree == "roce":
            roce_tree(root)
        else:
            shutil.copytree(CASES / "infiniband" / tree / "sys", root)

        async def advance(root: Path = root, roce: bool = tree == "roce") -> None:
            _bump_counters(root, 1000)
            if roce:  # a port with traffic: 2,100 packets/s, above the ECN ratio's floor of 1,000/s
                packets = root / "class/infiniband/mlx5_0/ports/1/counters/port_rcv_packets"
                packets.write_text(f"{int(packets.read_text()) + 20_000}\n")

        out += await _twice("infiniband", {}, advance, sysfs_root=root)
    return out


async def ethtool_samples(tmp: Path) -> list[Sample]:
    stats = tmp / "ethtool"
    stats.mkdir()
    for case in sorted(p for p in (CASES / "ethtool").iterdir() if p.is_dir()):
        text = (case / "input.txt").read_text()
        first = text.splitlines()[0] if text else ""
        if text and (not first.startswith("#") or first.startswith("# ethtool -S")):  # not -i / settings
            (stats / f"if{len(list(stats.iterdir()))}.txt").write_text(text)

    async def advance() -> None:
        for f in stats.iterdir():
            lines = [_bump_line(line) for line in f.read_text().splitlines()]
            f.write_text("\n".join(lines) + "\n")

    return await _twice("ethtool", {"stats_dir": str(stats), "include_unmapped": True}, advance)


def _bump_line(line: str) -> str:
    name, sep, value = line.rpartition(":")
    return f"{name}{sep} {int(value) + 7}" if sep and value.strip().isdigit() else line


async def nccl_samples(tmp: Path) -> list[Sample]:
    logs = tmp / "nccl"
    logs.mkdir()
    for case in sorted((CASES / "nccl").iterdir()):
        if case.is_dir():
            shutil.copy(case / "input.txt", logs / f"{case.name}.log")

    async def advance() -> None:
        pass

    return await _twice("nccl", {"log_glob": str(logs / "*.log"), "settle_seconds": 0}, advance)


async def netlink_samples() -> list[Sample]:
    async def advance() -> None:
        pass

    return await _twice("netlink", {}, advance)


async def pingmesh_samples() -> list[Sample]:
    """A real responder and prober on 127.0.0.1 exchanging UDP probes for a moment."""
    server = build(
        "pingmesh",
        {"listen_address": "127.0.0.1", "listen_port": 0},
        node="srv",
        sysfs_root=Path("/sys"),
        registry=REGISTRY,
    )
    assert isinstance(server, PingmeshCollector)
    await server.collect()
    peer = {"name": "node-002", "address": "127.0.0.1", "port": server.listen_port, "rate_per_second": 100}

    async def advance() -> None:
        await asyncio.sleep(0.3)

    try:
        return await _twice("pingmesh", {"peers": [peer], "respond": False, "timeout_seconds": 0.2}, advance)
    finally:
        await server.close()


async def jobs_samples(tmp: Path) -> list[Sample]:
    """A Slurm job file on a synthetic PCI tree (tests/support/pcitree.py), trusted without scontrol."""
    from tests.support.pcitree import four_gpu_server

    jobs = tmp / "jobs"
    jobs.mkdir()
    (jobs / "11.json").write_text('{"job_id": "11", "user": "alice", "name": "train", "gpus": "0,3"}')

    async def advance() -> None:
        pass

    root = four_gpu_server(tmp / "pci")
    return await _twice("jobs", {"jobs_dir": str(jobs), "scontrol": None}, advance, sysfs_root=root)


async def inspector_samples(tmp: Path) -> list[Sample]:
    folder = tmp / "inspector"
    shutil.copytree(CASES / "inspector", folder)

    async def advance() -> None:
        pass

    return await _twice("inspector", {"dir": str(folder)}, advance)


async def all_samples(tmp: Path) -> dict[str, list[Sample]]:
    return {
        "infiniband": await infiniband_samples(tmp),
        "ethtool": await ethtool_samples(tmp),
        "nccl": await nccl_samples(tmp),
        "netlink": await netlink_samples(),
        "pingmesh": await pingmesh_samples(),
        "jobs": await jobs_samples(tmp),
        "inspector": await inspector_samples(tmp),
    }
