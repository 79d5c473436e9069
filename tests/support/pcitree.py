"""A synthetic sysfs PCI tree (GPUs and HCAs) for the affinity tests. SYNTHETIC, not a capture.

Derived from the layout ``nvidia-smi topo -m`` shows for 8-GPU servers in public reports (one
ConnectX per PCIe switch, two host bridges per socket; e.g. NVIDIA/nccl-tests#78): folders are laid
out as the kernel does (``devices/pci<dom>:<bus>/<bridge>/.../<bdf>`` with ``vendor``, ``class``,
``numa_node``, and ``bus/pci/devices/<bdf>`` and ``class/infiniband/<dev>/device`` as relative
symlinks, per ``Documentation/PCI/sysfs-pci.rst``). Only the files fabricd reads are written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

GPU_CLASS = "0x030200"  # 3D controller (H100 SXM)
HCA_CLASS = "0x020700"  # InfiniBand controller


@dataclass(frozen=True)
class Dev:
    chain: tuple[str, ...]  # host bridge first ("pci0000:16"), then bridges, then the device
    numa: int
    vendor: str
    cls: str
    hca: str = ""  # the RDMA device name, for HCAs


def write(root: Path, devs: list[Dev]) -> Path:
    for d in devs:
        folder = root / "devices" / Path(*d.chain)
        folder.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", d.vendor), ("class", d.cls), ("numa_node", str(d.numa))):
            (folder / name).write_text(value + "\n")
        link = root / "bus" / "pci" / "devices" / d.chain[-1]
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(folder, link.parent))
        if d.hca:
            dev_dir = root / "class" / "infiniband" / d.hca
            dev_dir.mkdir(parents=True, exist_ok=True)
            (dev_dir / "device").symlink_to(os.path.relpath(folder, dev_dir))
    return root


def gpu(*chain: str, numa: int) -> Dev:
    return Dev(chain, numa, "0x10de", GPU_CLASS)


def hca(name: str, *chain: str, numa: int) -> Dev:
    return Dev(chain, numa, "0x15b3", HCA_CLASS, name)


def four_gpu_server(root: Path) -> Path:
    """Four GPUs, two HCAs, two sockets:

    socket 0, host bridge pci0000:16: switch 17:00.0 -> GPU 0 (19:00.0) and mlx5_0 (1a:00.0)
                                      switch 17:00.0 -> nested switch 1c:00.0 -> GPU 1 (1e:00.0)
    socket 0, host bridge pci0000:38: GPU 2 (3a:00.0) on its root port
    socket 1, host bridge pci0000:9a: switch 9b:00.0 -> GPU 3 (9d:00.0) and mlx5_1 (9e:00.0)
    so GPU 0 is PIX to mlx5_0, GPU 1 PXB, GPU 2 NODE (another host bridge, same socket), GPU 3 PIX
    to mlx5_1; a non-NVIDIA display controller (ASPEED BMC VGA) is ignored.
    """
    s0, s1 = ("pci0000:16", "0000:16:01.0", "0000:17:00.0"), ("pci0000:9a", "0000:9a:01.0", "0000:9b:00.0")
    devs = [
        gpu(*s0, "0000:18:00.0", "0000:19:00.0", numa=0),
        hca("mlx5_0", *s0, "0000:18:01.0", "0000:1a:00.0", numa=0),
        gpu(*s0, "0000:18:02.0", "0000:1c:00.0", "0000:1d:00.0", "0000:1e:00.0", numa=0),
        gpu("pci0000:38", "0000:38:01.0", "0000:3a:00.0", numa=0),
        gpu(*s1, "0000:9c:00.0", "0000:9d:00.0", numa=1),
        hca("mlx5_1", *s1, "0000:9c:01.0", "0000:9e:00.0", numa=1),
        Dev(("pci0000:00", "0000:00:1c.0", "0000:03:00.0"), 0, "0x1a03", "0x030000"),
    ]
    return write(root, devs)
