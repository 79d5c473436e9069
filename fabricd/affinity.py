"""GPU <-> HCA affinity from the PCIe topology in sysfs: which HCA each GPU's traffic leaves by.

NCCL gives each GPU the network device nearest to it on the PCIe tree, and uses GPUDirect RDMA
only up to a PCIe-switch distance (``NCCL_NET_GDR_LEVEL``, default PXB; NCCL's topology search in
``src/graph/paths.cc``). The distance classes are the ones ``nvidia-smi topo -m`` prints:

- ``PIX``  both hang below the same PCIe switch (one switch between them);
- ``PXB``  they share a bridge below the root complex, through more than one switch;
- ``PHB``  they meet only at the PCIe host bridge (the CPU's root complex);
- ``NODE`` different host bridges on the same NUMA node;
- ``SYS``  different NUMA nodes (the CPU interconnect, QPI/UPI/xGMI).

A PCI device's sysfs folder sits at ``devices/pci<domain>:<bus>/<bridge>/.../<device>``: the path
of bus addresses from the host bridge down is the device's place in the tree (kernel
``Documentation/PCI/sysfs-pci.rst``). GPUs are NVIDIA (vendor 0x10de) display or 3D controllers
(class 0x0300xx / 0x0302xx), numbered in PCI bus order, which is how NVML and ``nvidia-smi`` number
them by default and hence what Slurm's ``SLURM_JOB_GPUS`` indices mean with ``AutoDetect=nvml``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

RELATIONS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first
NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")


@dataclass(frozen=True, slots=True)
class PciDevice:
    """A PCI function and its place in the tree: host bridge, then the bus addresses down to it."""

    name: str  # "0000:1b:00.0" for a GPU, "mlx5_0" for an HCA
    address: str  # its own bus address
    host_bridge: str  # "pci0000:16"
    chain: tuple[str, ...]  # bridges from the root port down, then the device itself
    numa_node: int = -1


@dataclass(frozen=True, slots=True)
class Affinity:
    gpu: int  # index in PCI bus order (NVML's)
    gpu_address: str
    hca: str
    relation: str
    numa_node: int


def relation(a: PciDevice, b: PciDevice) -> str:
    """The ``nvidia-smi topo`` distance class between two devices."""
    common = _common_prefix(a.chain[:-1], b.chain[:-1])
    if a.host_bridge == b.host_bridge and common:
        one_switch = len(common) >= 2 and len(a.chain) == len(b.chain) == len(common) + 2
        return "PIX" if one_switch else "PXB"
    if a.host_bridge == b.host_bridge:
        return "PHB"
    if a.numa_node == b.numa_node and a.numa_node >= 0:
        return "NODE"
    return "SYS"


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> tuple[str, ...]:
    out = []
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        out.append(x)
    return tuple(out)


def nearest(gpus: Sequence[PciDevice], hcas: Sequence[PciDevice]) -> list[Affinity]:
    """Each GPU's nearest HCAs (every HCA tied at the best distance: dual-port cards, bonds)."""
    out: list[Affinity] = []
    for index, gpu in enumerate(gpus):
        ranked = [(RELATIONS.index(relation(gpu, h)), h) for h in hcas]
        if not ranked:
            continue
        best = min(rank for rank, _ in ranked)
        out.extend(
            Affinity(index, gpu.address, h.name, RELATIONS[best], gpu.numa_node)
            for rank, h in sorted(ranked, key=lambda x: x[1].name)
            if rank == best
        )
    return out


def hcas_of(gpus: Iterable[int], affinities: Sequence[Affinity]) -> tuple[str, ...]:
    """The HCAs a job's GPUs send through (sorted); empty when no affinity is known for them."""
    wanted = set(gpus)
    return tuple(sorted({a.hca for a in affinities if a.gpu in wanted}))


# --- sysfs (reads files under a given root; no global paths) ---------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def pci_device(sysfs_root: Path, link: Path, name: str) -> PciDevice | None:
    """The device a sysfs symlink (``bus/pci/devices/X``, ``class/infiniband/D/device``) points to."""
    real = Path(os.path.realpath(link))
    try:
        parts = real.relative_to(os.path.realpath(sysfs_root / "devices")).parts
    except ValueError:
        return None  # not a PCI device (a virtual device: rxe, siw)
    if not parts or not parts[0].startswith("pci"):
        return None
    numa = _read(real / "numa_node")
    return PciDevice(name, parts[-1], parts[0], tuple(parts[1:]), int(numa) if numa.lstrip("-").isdigit() else -1)


def read_gpus(sysfs_root: Path) -> list[PciDevice]:
    """NVIDIA GPUs under ``<sysfs>/bus/pci/devices``, in PCI bus order."""
    folder = sysfs_root / "bus" / "pci" / "devices"
    out = []
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        if _read(entry / "vendor") != NVIDIA or not _read(entry / "class").startswith(GPU_CLASSES):
            continue
        dev = pci_device(sysfs_root, entry, entry.name)
        if dev is not None:
            out.append(dev)
    return out


def read_hcas(sysfs_root: Path) -> list[PciDevice]:
    """RDMA devices under ``<sysfs>/class/infiniband`` that are PCI functions."""
    folder = sysfs_root / "class" / "infiniband"
    out = []
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        dev = pci_device(sysfs_root, entry / "device", entry.name)
        if dev is not None:
            out.append(dev)
    return out


def read_affinity(sysfs_root: Path) -> list[Affinity]:
    return nearest(read_gpus(sysfs_root), read_hcas(sysfs_root))
