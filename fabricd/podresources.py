"""Kubernetes jobs from the kubelet pod-resources API: which pod holds which GPUs and RDMA devices.

``List`` on the kubelet's unix socket (``/var/lib/kubelet/pod-resources/kubelet.sock``;
``v1.PodResourcesLister``, ``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``) answers, per pod
and container, the devices the device plugins handed out: GPU UUIDs (``nvidia.com/gpu``) and
RDMA / SR-IOV devices, whose ids are PCI addresses. The response is decoded here from the
protobuf wire format (https://protobuf.dev/programming-guides/encoding/): four nested messages
of strings and one int64, so the agent needs grpcio (the ``kubernetes`` extra) but no generated
code. The tests check this decoder against the real protobuf library on the published .proto.

Mapping to jobs (docs/jobs.md): a pod that holds devices is one job's share of this node. Its
job id is ``<namespace>/<job>``, the job taken from the pod name by ``job_pattern`` (the
``<job>-worker-3`` of Kubeflow's training operator and MPI operator, the ``<job>-<index>-<hash>``
of an indexed Job); GPUs map to their PCI address through ``<proc>/driver/nvidia/gpus/*/information``
(``GPU UUID:`` lines), RDMA VFs to their physical function's RDMA device in sysfs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fabricd.affinity import Affinity
from fabricd.extras import MissingExtra
from fabricd.jobfiles import MAX_TEXT, JobRecord

METHOD = "/v1.PodResourcesLister/List"
DEFAULT_JOB_PATTERN = (
    r"^(?P<job>.+?)-(?:(?:worker|launcher|master|chief|ps|evaluator|leader)(?:-\d+)?|\d+-[a-z0-9]{5}|[a-z0-9]{5})$"
)
_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class WireError(ValueError):
    """A response that is not a ListPodResourcesResponse in the protobuf wire format."""


@dataclass(frozen=True, slots=True)
class Devices:
    resource: str
    ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    namespace: str
    devices: tuple[Devices, ...] = field(default=())  # every container's, in order


# --- the protobuf wire format (varint, 64-bit, length-delimited, 32-bit) ----------------------------


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if i >= len(buf):
            raise WireError("truncated varint")
        b = buf[i]
        out |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return out, i
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one message: ints for varints and fixed widths, bytes for the rest."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield number, value
        elif wire == 2:
            size, i = _varint(buf, i)
            if i + size > len(buf):
                raise WireError(f"field {number}: {size} bytes announced, {len(buf) - i} left")
            yield number, buf[i : i + size]
            i += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if i + width > len(buf):
                raise WireError(f"field {number}: truncated fixed-width value")
            yield number, int.from_bytes(buf[i : i + width], "little")
            i += width
        else:
            raise WireError(f"field {number}: wire type {wire} is not used by this API")


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise WireError("a string field holds a number")
    return value.decode("utf-8", errors="replace")


def _msg(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise WireError("a message field holds a number")
    return value


def _numa_id(buf: bytes) -> int:
    """A NUMANode's ID; proto3 leaves a zero out, so node 0 is an empty message."""
    ids = [v for k, v in fields(buf) if k == 1 and isinstance(v, int)]
    return ids[-1] if ids else 0


def _devices(buf: bytes) -> Devices:
    resource, ids, numa = "", [], list[int]()
    for number, value in fields(buf):
        if number == 1:
            resource = _text(value)
        elif number == 2:
            ids.append(_text(value))
        elif number == 3:  # TopologyInfo { repeated NUMANode nodes = 1 } / NUMANode { int64 ID = 1 }
            numa.extend(_numa_id(_msg(node)) for n, node in fields(_msg(value)) if n == 1)
    return Devices(resource, tuple(ids), tuple(numa))


def decode_list_response(buf: bytes) -> list[Pod]:
    """A ``ListPodResourcesResponse``: pods with every container's devices (CPU, memory, DRA ignored)."""
    pods = []
    for number, value in fields(buf):
        if number != 1:
            continue
        name, namespace, devices = "", "", list[Devices]()
        for n, v in fields(_msg(value)):
            if n == 1:
                name = _text(v)
            elif n == 2:
                namespace = _text(v)
            elif n == 3:
                devices.extend(_devices(_msg(d)) for k, d in fields(_msg(v)) if k == 2)
        pods.append(Pod(name, namespace, tuple(devices)))
    return pods


# --- what the devices are on this node (sysfs and procfs under given roots) ------------------------


def job_of_pod(name: str, pattern: str = DEFAULT_JOB_PATTERN) -> str:
    m = re.match(pattern, name)
    return m.group("job") if m and m.groupdict().get("job") else name


def gpu_addresses(proc_root: Path) -> dict[str, str]:
    """GPU UUID -> PCI address, from the NVIDIA driver's ``information`` files."""
    out = {}
    folder = proc_root / "driver" / "nvidia" / "gpus"
    for info in sorted(folder.glob("*/information")) if folder.is_dir() else []:
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "GPU UUID":
                out[value.strip()] = info.parent.name.lower()
    return out


def rdma_device(sysfs_root: Path, pci: str) -> str:
    """The RDMA device a PCI function's traffic leaves by: its physical function's, for a VF."""
    dev = sysfs_root / "bus" / "pci" / "devices" / pci
    for candidate in (dev / "physfn", dev):
        names = sorted(p.name for p in (candidate / "infiniband").glob("*"))
        if names:
            return names[0]
    return ""


def is_pci(device_id: str) -> bool:
    return _PCI.match(device_id.lower()) is not None


def kube_jobs(
    raw: bytes, pattern: str, sysfs_root: Path, proc_root: Path, affinity: Sequence[Affinity]
) -> list[JobRecord]:
    """The pods that hold devices, as jobs: GPU indices (NVML's PCI order) and RDMA devices."""
    uuids = gpu_addresses(proc_root)
    index = {a.gpu_address: a.gpu for a in affinity}
    out = []
    for pod in decode_list_response(raw):
        ids = [i for d in pod.devices for i in d.ids]
        if not ids:
            continue
        gpus = sorted({index[uuids[i]] for i in ids if i in uuids and uuids[i] in index})
        hcas = sorted({h for i in ids if is_pci(i) and (h := rdma_device(sysfs_root, i.lower()))})
        job = job_of_pod(pod.name, pattern)
        out.append(
            JobRecord(
                job_id=f"{pod.namespace}/{job}"[:MAX_TEXT],
                scheduler="kubernetes",
                name=job[:MAX_TEXT],
                gpus=tuple(gpus),
                namespace=pod.namespace,
                pod=pod.name,
                devices=tuple(hcas),
            )
        )
    return out


class PodLister(Protocol):
    """The one call the agent makes to the kubelet: ``List``, the raw response bytes."""

    async def list(self, timeout_seconds: float) -> bytes: ...

    async def close(self) -> None: ...


class GrpcPodLister:
    """``List`` over the kubelet's unix socket with grpcio (the ``kubernetes`` extra)."""

    def __init__(self, socket: Path) -> None:
        try:
            import grpc
        except ModuleNotFoundError as exc:
            raise MissingExtra("kubernetes", "collectors.jobs.kubelet_socket", "grpc") from exc
        self.channel = grpc.aio.insecure_channel(f"unix://{socket}")
        self.call = self.channel.unary_unary(
            METHOD, request_serializer=lambda _request: b"", response_deserializer=lambda data: data
        )

    async def list(self, timeout_seconds: float) -> bytes:
        data = await self.call(None, timeout=timeout_seconds)
        assert isinstance(data, bytes)
        return data

    async def close(self) -> None:
        await self.channel.close()
