"""One port, one identity (issue 16 §3): a RoCE port's RDMA device port (sysfs counters) and its
network interface (ethtool, netlink) are one row in /api/v1/ports and ``fabricd ports``, with its
pause fraction beside its state and rate.

The sysfs trees here are synthetic, written with ``fabricd.sim.sysfstree``: the layout of
``gid_attrs/ndevs/<index>`` (one file per GID, holding the netdev name) and of ``device/net/<ifname>``
is the kernel's (Documentation/ABI/stable/sysfs-class-infiniband); no public capture of a RoCE
port's ``gid_attrs`` is in tests/cases yet.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from collectors.infiniband import InfinibandCollector
from fabricd.cli import main
from fabricd.collector import CollectorContext
from fabricd.model import Kind, Reading, Sample
from fabricd.pipeline import ScrapePipeline
from fabricd.portview import port_views, select_ports
from fabricd.server import db
from fabricd.server.store.storage import Storage
from fabricd.sim.sysfstree import DeviceTree, PortTree, write_infiniband_tree
from tests.support.server import ServerProcess, encoded, make_batch

ROCE = PortTree(link_layer="Ethernet", rate="100 Gb/sec (4X EDR)", ndevs={"0": "ens1f0np0", "1": "ens1f0np0"})


def _tree(root: Path) -> None:
    write_infiniband_tree(root, {"mlx5_0": DeviceTree(ports={"1": ROCE}), "mlx5_1": DeviceTree()})


def _port_info(root: Path) -> dict[str, dict[str, str]]:
    c = InfinibandCollector(CollectorContext(node="n1", sysfs_root=root, options=InfinibandCollector.Options()))
    return {r.device: dict(r.labels) for r in c.scrape() if r.name == "port_info"}


def test_the_infiniband_collector_names_a_roce_ports_netdev(tmp_path: Path) -> None:
    _tree(tmp_path)
    info = _port_info(tmp_path)
    assert info["mlx5_0"]["netdev"] == "ens1f0np0"  # from gid_attrs/ndevs/0
    assert "netdev" not in info["mlx5_1"]  # an InfiniBand port has none


def test_without_gid_attrs_the_devices_only_net_entry_is_its_netdev(tmp_path: Path) -> None:
    no_gids = PortTree(link_layer="Ethernet")
    write_infiniband_tree(tmp_path, {"mlx5_0": DeviceTree(ports={"1": no_gids}), "mlx5_1": DeviceTree()})
    (tmp_path / "class/infiniband/mlx5_0/device/net/ens2np0").mkdir(parents=True)
    (tmp_path / "class/infiniband/mlx5_1/device/net/ib0").mkdir(parents=True)  # IPoIB: not the port
    info = _port_info(tmp_path)
    assert (info["mlx5_0"].get("netdev"), info["mlx5_1"].get("netdev")) == ("ens2np0", None)


def _samples(root: Path, ts: float) -> list[Sample]:
    """One scrape of the host: its sysfs port (real collector) and its netdev's ethtool/netlink readings."""
    c = InfinibandCollector(CollectorContext(node="n1", sysfs_root=root, options=InfinibandCollector.Options()))
    readings = list(c.scrape())
    readings += [
        Reading(
            "ethtool",
            "ens1f0np0",
            "",
            "rx_prio3_pause_duration",
            0.0,
            "seconds",
            Kind.COUNTER,
            (("priority", "3"),),
            "rx_pause_duration",
        ),
        Reading("netlink", "ens1f0np0", "", "rx_bytes", 0.0, "bytes", Kind.COUNTER, (), "rx_bytes"),
    ]
    return readings_at(readings, ts)


def readings_at(readings: list[Reading], ts: float) -> list[Sample]:
    return [Sample(ts, r) for r in readings]


def _two_scrapes(root: Path) -> list[tuple[str, Sample]]:
    """Two scrapes 10 s apart through the agent's pipeline: 2.5 s paused (25 %), 1 GB received."""
    pipe = ScrapePipeline()
    now = 1_700_000_000.0
    first = [s.reading for s in _samples(root, now)]
    pipe.samples(now, first)
    second = [_bumped(r) for r in first]
    return [("n1", s) for s in pipe.samples(now + 10, second)]


def _bumped(r: Reading) -> Reading:
    bump = {"rx_prio3_pause_duration": 2.5, "rx_bytes": 1e9}.get(r.counter, 0.0)
    return Reading(r.source, r.device, r.port, r.counter, r.value + bump, r.unit, r.kind, r.labels, r.name, r.width)


def test_the_roce_port_is_one_row_with_its_pause_fraction(tmp_path: Path) -> None:
    _tree(tmp_path)
    views = port_views(_two_scrapes(tmp_path))
    rows = sorted((v.node, v.device, v.port, v.netdev, v.state, v.pause, v.rx) for v in views)
    assert rows == [
        ("n1", "mlx5_0", "1", "ens1f0np0", "ACTIVE", 0.25, 1e8),
        ("n1", "mlx5_1", "1", "", "ACTIVE", None, None),
    ]
    top = select_ports(views, "ACTIVE", "pause", 1)
    assert [(v.device, v.pause) for v in top] == [("mlx5_0", 0.25)]


@pytest.fixture
def central(tmp_path: Path) -> Iterator[tuple[ServerProcess, str]]:
    data = tmp_path / "data"
    engine = db.make_engine(f"sqlite:///{data / 'fabricd.db'}")
    db.prepare(engine)
    admin = Storage.open(engine).tokens.create("admin", time.time(), note="ports")[1]
    engine.dispose()
    server = ServerProcess(data, extra=["--log-level", "warning"]).start()
    try:
        yield server, admin
    finally:
        server.stop()


@pytest.mark.slow
def test_api_and_cli_list_the_roce_port_once_sorted_by_pause(
    central: tuple[ServerProcess, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, admin = central
    root = tmp_path / "sys"
    _tree(root)
    now = time.time()
    samples = [s for _, s in _two_scrapes(root)]
    samples = [Sample(now, s.reading, s.rate, s.status, s.since) for s in samples]
    body, headers = encoded(make_batch("n1", "1", samples, ts=now))
    auth = {"Authorization": f"Bearer {admin}"}
    httpx.post(f"{server.url}/api/v1/ingest", content=body, headers={**headers, **auth}, timeout=10).raise_for_status()
    got = httpx.get(f"{server.url}/api/v1/ports?sort=pause&limit=20&state=ACTIVE", headers=auth, timeout=10).json()
    assert [(p["device"], p["port"], p["netdev"], p["pause_fraction"]) for p in got] == [
        ("mlx5_0", "1", "ens1f0np0", 0.25),
        ("mlx5_1", "1", "", None),
    ]
    assert main(["ports", "--sort", "pause", "--json", "--server", server.url, "--token", admin]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted((p["device"], p["port"]) for p in listed) == [("mlx5_0", "1"), ("mlx5_1", "1")]  # no netdev row
