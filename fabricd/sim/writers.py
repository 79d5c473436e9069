"""Show the simulated counters the way a host does: a sysfs tree per node and ``ethtool -S`` text.

The first write lays the whole tree out with ``fabricd.sim.sysfstree.write_infiniband_tree`` (the same
writer the collector tests use, formats as the kernel's). Later writes rewrite only the files whose
content changed, in place (same inode, like a sysfs attribute): most error counters stay put between
scrapes, so an interval costs a few writes per port instead of ~60.

Layout under a node's folder::

    sys/class/infiniband/<dev>/...      sysfs_root = <node>/sys
    ethtool/<dev>.txt                   RoCE only; ethtool collector option ``stats_dir``

The netdev statistics file of a RoCE port is named after its RDMA device (``mlx5_3.txt``): on a host
the pairing comes from ``/sys/class/infiniband/<dev>/ports/1/gid_attrs/ndevs``; naming the file after
the device lets detectors join ethtool and sysfs readings without that map (docs/simulator.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fabricd.sim.hca import COUNTERS_DATA, HW_EXTRA_64, LIFESPAN_MS, CounterTable, HcaPortState, ethtool_names
from fabricd.sim.sysfstree import (
    MLX5_CONG_COUNTERS,
    MLX5_Q_COUNTERS,
    PORT_COUNTERS_BASE,
    DeviceTree,
    PortTree,
    render,
    tree_files,
    write_in_place,
    write_infiniband_tree,
)

FW_VERSION = "28.41.1000"  # ConnectX-7 firmware on the gpud H100 capture
BOARD_ID = "MT_0000000838"
HCA_TYPE = "MT4129"


def port_tree(state: HcaPortState, rate: str) -> PortTree:
    state_text, phys_text = state.state_text()
    counters = {name: state.counters.value(name) for name in (*PORT_COUNTERS_BASE, *COUNTERS_DATA)}
    hw: dict[str, int | str] = {name: state.hw.value(name) for name in (*MLX5_Q_COUNTERS, *HW_EXTRA_64)}
    if state.roce:
        hw.update({name: state.hw.value(name) for name in MLX5_CONG_COUNTERS})
    hw["lifespan"] = LIFESPAN_MS
    return PortTree(
        state=state_text,
        phys_state=phys_text,
        rate=rate,
        link_layer="Ethernet" if state.roce else "InfiniBand",
        counters=dict(sorted(counters.items())),
        hw_counters=dict(sorted(hw.items())),
    )


def device_trees(ports: Iterable[HcaPortState], rate: str) -> dict[str, DeviceTree]:
    return {
        p.device: DeviceTree(fw_ver=FW_VERSION, board_id=BOARD_ID, hca_type=HCA_TYPE, ports={"1": port_tree(p, rate)})
        for p in ports
    }


def rate_text(gbps: int) -> str:
    """The ``rate`` file: ``400 Gb/sec (4X NDR)`` (4 lanes; the speed name follows the lane rate)."""
    per_lane = gbps / 4
    name = {25: "EDR", 50: "HDR", 100: "NDR", 200: "XDR"}.get(int(per_lane), "")
    return f"{gbps} Gb/sec (4X {name})" if name else f"{gbps} Gb/sec (4X)"


def ethtool_text(state: HcaPortState) -> str:
    """``ethtool -S <if>`` output: the ``NIC statistics:`` header and 5-space indented lines."""
    lines = ["NIC statistics:"]
    lines += [f"     {name}: {state.ethtool.value(name)}" for name in ethtool_names()]
    return "\n".join(lines) + "\n"


@dataclass
class NodeWriter:
    """Writes one node's files; remembers what each file holds to skip unchanged ones."""

    root: Path
    rate: str
    plan: list[tuple[str, CounterTable, str]] = field(default_factory=list)
    last: list[int] = field(default_factory=list)
    texts: dict[str, bytes] = field(default_factory=dict)
    state_paths: list[tuple[str, str]] = field(default_factory=list)

    @property
    def sysfs_root(self) -> Path:
        return self.root / "sys"

    @property
    def ethtool_dir(self) -> Path:
        return self.root / "ethtool"

    def write(self, ports: list[HcaPortState]) -> None:
        if not self.plan:
            self._lay_out(ports)
        else:
            self._update(ports)
        if ports and ports[0].roce:
            for p in ports:
                self._put(f"{self.ethtool_dir}/{p.device}.txt", ethtool_text(p).encode())

    def _lay_out(self, ports: list[HcaPortState]) -> None:
        top = self.sysfs_root / "class" / "infiniband"
        lay_out(top, device_trees(ports, self.rate))
        for p in ports:
            base = top / p.device / "ports" / "1"
            names = [*PORT_COUNTERS_BASE, *COUNTERS_DATA]
            self.plan += [(str(base / "counters" / n), p.counters, n) for n in names]
            hw_names = [*MLX5_Q_COUNTERS, *HW_EXTRA_64, *(MLX5_CONG_COUNTERS if p.roce else ())]
            self.plan += [(str(base / "hw_counters" / n), p.hw, n) for n in hw_names]
            state_text, phys_text = p.state_text()
            self.state_paths.append((str(base / "state"), str(base / "phys_state")))
            self.texts[str(base / "state")] = render(state_text)
            self.texts[str(base / "phys_state")] = render(phys_text)
        self.last = [table.value(name) for _, table, name in self.plan]
        if ports and ports[0].roce:
            self.ethtool_dir.mkdir(parents=True, exist_ok=True)

    def _update(self, ports: list[HcaPortState]) -> None:
        last = self.last
        for i, (path, table, name) in enumerate(self.plan):
            value = table.value(name)
            if value != last[i]:
                write_in_place(path, b"%d\n" % value)
                last[i] = value
        for p, (state_path, phys_path) in zip(ports, self.state_paths, strict=True):
            state_text, phys_text = p.state_text()
            self._put(state_path, render(state_text))
            self._put(phys_path, render(phys_text))

    def _put(self, path: str, data: bytes) -> None:
        if self.texts.get(path) == data:
            return
        write_in_place(path, data)
        self.texts[path] = data


def lay_out(top: Path, trees: dict[str, DeviceTree]) -> None:
    """A fresh tree: the files and formats of ``fabricd.sim.sysfstree.tree_files``, written once.
    (``write_infiniband_tree`` also prunes stale files, a walk that costs seconds on 256 nodes.)"""
    if top.exists():
        write_infiniband_tree(top.parent.parent, trees)
        return
    for rel, data in tree_files(trees).items():
        path = top / rel
        if data is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_in_place(path, data)
