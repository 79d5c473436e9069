"""Kubernetes jobs: a gRPC server speaking the kubelet pod-resources v1 protocol on a unix socket.

The server's messages are built by the real protobuf library from the published
``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`` (tests/cases/jobs/podresources/, compiled
here with grpcio-tools), so the agent's own decoder (``fabricd/podresources.py``) is checked
against the reference encoding, over a real gRPC connection.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from grpc_tools import protoc

from collectors.jobs import JobsCollector
from fabricd.collector import build
from fabricd.podresources import Devices, Pod, WireError, decode_list_response
from tests.helpers import CASES
from tests.support.pcitree import four_gpu_server

PROTO = CASES / "jobs" / "podresources" / "api.proto"
REGISTRY = {"jobs": "collectors.jobs:JobsCollector"}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType]:
    out = tmp_path_factory.mktemp("podresources")
    args = ["protoc", f"-I{PROTO.parent}", f"--python_out={out}", f"--grpc_python_out={out}", str(PROTO)]
    assert protoc.main(args) == 0
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("api_pb2"), importlib.import_module("api_pb2_grpc")
    finally:
        sys.path.remove(str(out))


def response(pb: ModuleType) -> Any:
    gpu = pb.ContainerDevices(
        resource_name="nvidia.com/gpu",
        device_ids=["GPU-aaaa", "GPU-dddd"],
        topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=0), pb.NUMANode(ID=1)]),
    )
    vf = pb.ContainerDevices(resource_name="nvidia.com/sriov_rdma_vf", device_ids=["0000:1a:00.2"])
    trainer = pb.ContainerResources(name="trainer", devices=[gpu, vf], cpu_ids=[4, 5])
    bench = pb.ContainerResources(
        name="bench", devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-bbbb"])]
    )
    return pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(name="llama-worker-0", namespace="research", containers=[trainer]),
            pb.PodResources(name="notebook-x7k2q", namespace="default", containers=[pb.ContainerResources(name="nb")]),
            pb.PodResources(name="bench-0-abcde", namespace="perf", containers=[bench]),
        ]
    )


def test_decoder_matches_the_reference_encoding(api: tuple[ModuleType, ModuleType]) -> None:
    pb, _ = api
    data = response(pb).SerializeToString()
    assert decode_list_response(data) == [
        Pod(
            "llama-worker-0",
            "research",
            (
                Devices("nvidia.com/gpu", ("GPU-aaaa", "GPU-dddd"), (0, 1)),
                Devices("nvidia.com/sriov_rdma_vf", ("0000:1a:00.2",)),
            ),
        ),
        Pod("notebook-x7k2q", "default", ()),
        Pod("bench-0-abcde", "perf", (Devices("nvidia.com/gpu", ("GPU-bbbb",)),)),
    ]
    with pytest.raises(WireError, match=r"field 1: \d+ bytes announced, \d+ left"):
        decode_list_response(data[:-3])


def node_files(root: Path) -> tuple[Path, Path]:
    """The synthetic 4-GPU PCI tree, a VF of mlx5_0 at 0000:1a:00.2, and the driver's GPU files."""
    sysfs = four_gpu_server(root / "sys")
    pf = Path(os.path.realpath(sysfs / "bus/pci/devices/0000:1a:00.0"))
    (pf / "infiniband" / "mlx5_0").mkdir(parents=True)
    vf = pf.parent / "0000:1a:00.2"
    vf.mkdir()
    (vf / "physfn").symlink_to("../0000:1a:00.0")
    (sysfs / "bus/pci/devices/0000:1a:00.2").symlink_to(os.path.relpath(vf, sysfs / "bus/pci/devices"))
    proc = root / "proc"
    for pci, uuid in (("0000:19:00.0", "GPU-aaaa"), ("0000:1e:00.0", "GPU-bbbb"), ("0000:9d:00.0", "GPU-dddd")):
        info = proc / "driver/nvidia/gpus" / pci / "information"
        info.parent.mkdir(parents=True)
        info.write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t {uuid}\nBus Location: \t {pci}\n"
        )
    return sysfs, proc


@pytest.fixture
async def kubelet(api: tuple[ModuleType, ModuleType], tmp_path: Path) -> AsyncIterator[tuple[Path, grpc.aio.Server]]:
    pb, pb_grpc = api

    class Lister(pb_grpc.PodResourcesListerServicer):
        async def List(self, request: Any, context: Any) -> Any:  # the API names it List
            return response(pb)

    server = grpc.aio.server()
    pb_grpc.add_PodResourcesListerServicer_to_server(Lister(), server)
    socket = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    yield socket, server
    await server.stop(None)


async def test_pods_become_jobs_with_their_gpus_and_rdma_devices(
    kubelet: tuple[Path, grpc.aio.Server], tmp_path: Path
) -> None:
    socket, server = kubelet
    sysfs, proc = node_files(tmp_path)
    options = {"kubelet_socket": str(socket), "proc_root": str(proc), "jobs_dir": str(tmp_path / "none")}
    c = build("jobs", options, node="n1", sysfs_root=sysfs, registry=REGISTRY)
    assert isinstance(c, JobsCollector)
    expected = {
        # The VF the pod holds is mlx5_0's: its traffic leaves there, though GPU 3 is nearest mlx5_1.
        "research/llama": {
            "user": "",
            "name": "llama",
            "scheduler": "kubernetes",
            "gpus": "0,3",
            "hcas": "mlx5_0",
            "namespace": "research",
            "pod": "llama-worker-0",
        },
        "perf/bench": {
            "user": "",
            "name": "bench",
            "scheduler": "kubernetes",
            "gpus": "1",
            "hcas": "mlx5_0",
            "namespace": "perf",
            "pod": "bench-0-abcde",
        },
    }
    try:
        got = {r.device: dict(r.labels) for r in await c.collect() if r.source == "job" and r.device}
        assert got == expected
        await server.stop(None)  # the kubelet restarts: the last answer stands
        got = {r.device: dict(r.labels) for r in await c.collect() if r.source == "job" and r.device}
        assert got == expected
    finally:
        await c.close()


def test_job_pattern_is_checked_at_load(tmp_path: Path) -> None:
    from fabricd.collector import CollectorConfigError

    with pytest.raises(
        CollectorConfigError, match=r"collectors.jobs.job_pattern: Value error, needs a group named job"
    ):
        build("jobs", {"job_pattern": "^(.+)-worker$"}, node="n1", sysfs_root=tmp_path, registry=REGISTRY)


@pytest.mark.parametrize(
    ("pod", "job"),
    [
        ("llama-70b-worker-12", "llama-70b"),  # Kubeflow training operator
        ("mpi-bench-launcher", "mpi-bench"),  # MPI operator
        ("sweep-3-x7k2q", "sweep"),  # indexed Job
        ("eval-x7k2q", "eval"),  # Job
        ("standalone", "standalone"),  # no pattern: the pod is the job
    ],
)
def test_job_names_from_pod_names(pod: str, job: str) -> None:
    from fabricd.podresources import job_of_pod

    assert job_of_pod(pod) == job
