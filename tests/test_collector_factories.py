"""Typed side-effect factories (``fabricd.collector.CollectorFactories``): each collector takes the
instance of its own dataclass from what the caller gives and production defaults otherwise."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
from collections.abc import Sequence
from pathlib import Path

import pytest

from collectors import REGISTRY
from collectors.nccl import NcclCollector, NcclFactories
from collectors.netlink import LinkStats, NetlinkCollector, NetlinkFactories, NetlinkSnapshot
from collectors.pingmesh import PingmeshCollector
from fabricd.collector import CollectorContext, CollectorFactories, build_collectors, close_collectors
from fabricd.command import CommandResult
from fabricd.probe import plain_udp_socket
from tests.helpers import CASES

NCCL_OUTPUT = (CASES / "nccl" / "a3mega_all_reduce_2node_16xH100" / "input.txt").read_text()


class RecordingRunner:
    def __init__(self) -> None:
        self.argv: list[list[str]] = []

    async def run(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult:
        self.argv.append(list(argv))
        return CommandResult(NCCL_OUTPUT, 0, duration_seconds=2.0)


class OneLink:
    async def snapshot(self) -> NetlinkSnapshot:
        return NetlinkSnapshot([LinkStats(7, "rdma0", False, {"rx_bytes": 5})], [])


async def test_one_pool_of_factories_serves_every_collector_and_the_rest_get_production_defaults() -> None:
    runner = RecordingRunner()
    given = (NcclFactories(runner=lambda: runner, monotonic=lambda: 0.0), NetlinkFactories(source=lambda _: OneLink()))
    configured = {
        "nccl": {"command": ["all_reduce_perf", "-b", "8"], "interval_seconds": 60},
        "netlink": {"qdiscs": False},
        "pingmesh": {"respond": False},
    }
    built = build_collectors(configured, node="n1", sysfs_root=Path("/nonexistent"), registry=REGISTRY, factories=given)
    try:
        nccl, netlink, pingmesh = built["nccl"], built["netlink"], built["pingmesh"]
        assert isinstance(nccl, NcclCollector) and isinstance(netlink, NetlinkCollector)
        assert [(r.device, r.counter, r.value) for r in await netlink.collect()] == [("rdma0", "rx_bytes", 5.0)]
        await nccl.collect()  # due at t=0: starts the run
        await asyncio.sleep(0)
        finished = await nccl.collect()
        assert runner.argv == [["all_reduce_perf", "-b", "8"]]  # started once: the next is due at t=60
        assert [r.value for r in finished if r.counter == "success"] == [1.0]
        assert isinstance(pingmesh, PingmeshCollector) and pingmesh.socket_factory is plain_udp_socket
    finally:
        await close_collectors(built.values())


def test_a_context_refuses_two_factories_of_one_type() -> None:
    with pytest.raises(ValueError, match=r"^factories given twice: NetlinkFactories$"):
        CollectorContext("n1", factories=(NetlinkFactories(), NcclFactories(), NetlinkFactories()))


def _declared_factories() -> list[type[CollectorFactories]]:
    found: dict[str, type[CollectorFactories]] = {}
    for spec in REGISTRY.values():
        module = importlib.import_module(spec.partition(":")[0])
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(obj, CollectorFactories)
                and obj is not CollectorFactories
                and obj.__module__ == module.__name__
            ):
                found[obj.__qualname__] = obj
    return [found[name] for name in sorted(found)]


def test_every_collectors_factories_are_a_frozen_dataclass_of_production_defaults() -> None:
    kinds = _declared_factories()
    assert [k.__name__ for k in kinds] == [
        "CaptureFactories",
        "EthtoolFactories",
        "IbFabricFactories",
        "InfinibandFactories",
        "JobsFactories",
        "LldpFactories",
        "NcclFactories",
        "NetlinkFactories",
        "PingmeshFactories",
        "RasFactories",
    ]
    for kind in kinds:
        assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen, kind  # type: ignore[attr-defined]
        fields = dataclasses.fields(kind)
        assert fields and all(f.default is not dataclasses.MISSING for f in fields), kind
        assert CollectorContext("n1").factories_for(kind) == kind()  # nothing given: the defaults
