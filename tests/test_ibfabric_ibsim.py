"""The ibfabric collector against a simulated subnet run by the real tools (tests/support/ibsim.py):
ibsim, OpenSM, and infiniband-diags' ibnetdiscover and ibtracert as the collector runs them.

Oracle: the forwarding tables themselves, read with ``ibroute`` (another infiniband-diags tool,
which dumps a switch's LFT and traces nothing): walking them from each source's leaf over the
cables ibnetdiscover found must give the same links as the routes the collector traced. Then a
cable dies, the SM sweeps again, and both the fabric and the routes the central assembles follow.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.ibfabric import IbFabricCollector, IbFabricFactories, IbFabricOptions
from fabricd.collector import CollectorContext
from fabricd.command import SubprocessRunner
from fabricd.model import Reading, Sample
from fabricd.parsers.ibnetdiscover import IbnetPort, parse_ibnetdiscover
from fabricd.topology import Topology, from_ibnetdiscover, to_doc
from fabricd.topology.assemble import discovered
from fabricd.topology.diff import diff
from fabricd.topology.ibnet import ca_ids, end_id, switch_ids
from tests.helpers import CASES
from tests.support.ibsim import Ibsim
from tests.test_ibfabric_routes import routes_from_readings

FABRIC = CASES / "ibtracert" / "ibsim" / "fabric.net"
HOSTS = ["gpu-a01", "gpu-a02", "gpu-b01", "gpu-b02"]
LFT_ROW = re.compile(r"^0x([0-9a-f]{4}) (\d{3}) :")


@pytest.fixture
def subnet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ibsim]:
    sim = Ibsim(FABRIC, tmp_path)
    for key, value in sim.env.items():  # the collector's subprocesses reach the simulator
        monkeypatch.setenv(key, value)
    try:
        yield sim.start()
    finally:
        sim.stop()


def collector() -> IbFabricCollector:
    options = IbFabricOptions(
        ibnetdiscover_command=["ibsim-run", "ibnetdiscover", "-p"],
        perfquery_command=["ibsim-run", "perfquery", "-x", "-l", "-G", "{guid}"],
        perfquery_errors_command=None,
        ibtracert_command=["ibsim-run", "ibtracert", "{src_lid}", "{dst_lid}"],
        trace_nodes=HOSTS,
        trace_pairs_per_scrape=12,
        rediscover_every=1,
        timeout_seconds=20,
    )
    return IbFabricCollector(
        CollectorContext("sm-host", options=options, factories=(IbFabricFactories(SubprocessRunner),))
    )


def lft_routes(sim: Ibsim, ports: list[IbnetPort], topo: Topology) -> dict[tuple[str, str], list[str]]:
    """Every host pair's links, walked through the switches' LFTs as ``ibroute`` dumps them."""
    switches, cas = switch_ids(ports), ca_ids(ports)
    cable = {(p.local.guid, p.local.port): p.remote for p in ports if p.remote is not None}
    lids = {p.local.guid: p.local.lid for p in ports if p.local.type == "SW"}
    lft: dict[str, dict[int, int]] = {}
    for guid, lid in lids.items():
        dump = sim.run("ibroute", str(lid)).stdout.splitlines()
        lft[guid] = {int(m[1], 16): int(m[2]) for line in dump if (m := LFT_ROW.match(line))}
    hca_lid = {end_id(p.local, switches, cas): p.local.lid for p in ports if p.local.type == "CA"}
    out = {}
    for src in HOSTS:
        for dst in HOSTS:
            if src == dst:
                continue
            a, b = f"{src}/mlx5_0", f"{dst}/mlx5_0"
            here = next(p.remote for p in ports if p.local.type == "CA" and end_id(p.local, switches, cas) == a)
            assert here is not None
            hops = [switches[here.guid]]
            while True:
                far = cable[(here.guid, lft[here.guid][hca_lid[b]])]
                if far.type == "CA":
                    break
                hops.append(switches[far.guid])
                here = far
            links = [f"{a}~{hops[0]}"] + [topo.link_between(x, y) or "?" for x, y in itertools.pairwise(hops)]
            out[(src, dst)] = [*links, f"{b}~{hops[-1]}"]
    return out


def as_samples(readings: list[Reading], ts: float) -> list[tuple[str, Sample]]:
    return [("sm-host", Sample(ts, r)) for r in readings]


async def test_traced_routes_match_the_forwarding_tables_before_and_after_a_cable_dies(subnet: Ibsim) -> None:
    coll = collector()
    first = list(await coll.collect())
    ports = parse_ibnetdiscover(subnet.run("ibnetdiscover", "-p").stdout).ports
    topo = from_ibnetdiscover(subnet.run("ibnetdiscover", "-p").stdout)
    assert sum(r.name == "path_info" for r in first) == 12  # every ordered pair of the 4 hosts
    assert routes_from_readings(topo, first) == lft_routes(subnet, ports, topo)
    # minhop spreads leaf-1's destinations over both spines (a01 -> b01 via one, a01 -> b02 the other)
    assert {routes_from_readings(topo, first)[("gpu-a01", d)][1] for d in ("gpu-b01", "gpu-b02")} == {
        "ib-leaf-1~ib-spine-1",
        "ib-leaf-1~ib-spine-2",
    }

    subnet.console('Unlink "ib-spine-2"[2]')  # the spine-2 - leaf-2 cable goes down
    subnet.sweep()
    after = list(await coll.collect())
    ports_down = parse_ibnetdiscover(subnet.run("ibnetdiscover", "-p").stdout).ports
    topo_down = from_ibnetdiscover(subnet.run("ibnetdiscover", "-p").stdout)
    routes_down = routes_from_readings(topo_down, after)
    assert routes_down == lft_routes(subnet, ports_down, topo_down)
    assert not any("ib-leaf-2~ib-spine-2" in links for links in routes_down.values())
    found = discovered([], to_doc(topo), ibfabric=as_samples(after, 2.0))
    assert [(c.kind, c.element) for c in found.changes] == [("link_removed", "ib-leaf-2~ib-spine-2")]
    assert [(c.kind, c.element) for c in diff(topo, topo_down)] == [("link_removed", "ib-leaf-2~ib-spine-2")]
