"""The central assembles the topology from its agents' lldp readings (issue 16 §2): the document,
links heard from one side only, and changes against the stored topology (a new switch, a moved
cable), served at /api/v1/topology/discovered and through ``fabricd topology discover --central``
and ``fabricd topology diff``. A real central; the readings are what the lldp collector makes of
real lldpd captures (tests/cases/lldp)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from collectors.lldp import chassis_reading, neighbour_reading
from fabricd.cli import main
from fabricd.model import Reading, Sample
from fabricd.parsers.lldp import LldpChassis, parse_lldpctl_json
from fabricd.server import db
from fabricd.server.store.storage import Storage
from tests.helpers import CASES
from tests.support.server import ServerProcess, encoded, make_batch

pytestmark = pytest.mark.slow
LLDP = CASES / "lldp"
HOST_SIDE = parse_lldpctl_json((LLDP / "lldpctl_two_neighbours.json").read_text()).neighbours
LEAF_SIDE = parse_lldpctl_json((LLDP / "lldpctl_switch_side.json").read_text()).neighbours
LEAF = LldpChassis("ib-leaf-3", "b2:85:2b:42:fd:ff", capabilities=frozenset({"Router"}))
B02 = LldpChassis("gpu-b02", "aa:36:32:f7:09:40", capabilities=frozenset({"Station"}))


class Central:
    def __init__(self, server: ServerProcess, admin: str) -> None:
        self.server, self.admin = server, admin
        self.seq = 0

    def report(self, node: str, readings: list[Reading]) -> None:
        self.seq += 1
        now = time.time()
        batch = make_batch(node, str(self.seq), [Sample(now, r) for r in readings], ts=now, seq=self.seq)
        body, headers = encoded(batch)
        httpx.post(
            f"{self.server.url}/api/v1/ingest",
            content=body,
            headers={**headers, "Authorization": f"Bearer {self.admin}"},
            timeout=10,
        ).raise_for_status()

    def discovered(self) -> dict[str, object]:
        resp = httpx.get(
            f"{self.server.url}/api/v1/topology/discovered",
            headers={"Authorization": f"Bearer {self.admin}"},
            timeout=10,
        )
        resp.raise_for_status()
        return resp.json()  # type: ignore[no-any-return]

    def cli(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
        code = main(["topology", *args, "--server", self.server.url, "--token", self.admin])
        out, err = capsys.readouterr()
        return code, out, err


@pytest.fixture
def central(tmp_path: Path) -> Iterator[Central]:
    data = tmp_path / "data"
    engine = db.make_engine(f"sqlite:///{data / 'fabricd.db'}")
    db.prepare(engine)
    admin = Storage.open(engine).tokens.create("admin", time.time(), note="topology")[1]
    engine.dispose()
    server = ServerProcess(data, extra=["--log-level", "warning"]).start()
    try:
        yield Central(server, admin)
    finally:
        server.stop()


def _links(doc: object) -> dict[str, list[dict[str, str]]]:
    assert isinstance(doc, dict)
    return {f"{x['a']}~{x['b']}": x.get("cables", []) for x in doc["links"]}


def test_the_central_assembles_lldp_and_flags_what_changed(
    central: Central, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    central.report("gpu-a17", [neighbour_reading(n) for n in HOST_SIDE])
    central.report("ib-leaf-3", [neighbour_reading(LEAF_SIDE[0]), chassis_reading(LEAF)])  # tpb1 not heard
    found = central.discovered()
    assert _links(found["document"]) == {
        "gpu-a17/tpa0~ib-leaf-3": [{"a_port": "tpa0", "b_port": "tpb0"}],
        "gpu-a17/tpa1~ib-leaf-3": [{"a_port": "tpa1", "b_port": "tpb1"}],
    }
    assert found["problems"] == ["gpu-a17 tpa1 ~ ib-leaf-3 tpb1: seen from gpu-a17 only"]
    assert found["changes"] == [  # nothing stored yet: all of it is new
        {"kind": "switch_added", "element": "ib-leaf-3", "detail": "leaf"},
        {"kind": "host_added", "element": "gpu-a17", "detail": "tpa0, tpa1"},
        {"kind": "link_added", "element": "gpu-a17/tpa0~ib-leaf-3", "detail": "tpa0-tpb0"},
        {"kind": "link_added", "element": "gpu-a17/tpa1~ib-leaf-3", "detail": "tpa1-tpb1"},
    ]

    # The operator stores what was found: discover --central | push -
    code, out, err = central.cli(capsys, "discover", "--central")
    assert (code, err) == (0, "fabricd: discovered: gpu-a17 tpa1 ~ ib-leaf-3 tpb1: seen from gpu-a17 only\n")
    monkeypatch.setattr("sys.stdin", io.StringIO(out))
    assert central.cli(capsys, "push", "-") == (0, "topology stored: 3 elements, 2 links\n", "")
    central.report("ib-leaf-3", [neighbour_reading(n) for n in LEAF_SIDE] + [chassis_reading(LEAF)])
    assert central.cli(capsys, "diff") == (0, "no change\n", "")

    # A cable moves to another port of the leaf, and a new switch appears behind tpa1.
    moved = replace(HOST_SIDE[0], port_id="tpb5", port_descr="tpb5")
    spine = LldpChassis("ib-spine-1", "02:00:00:00:00:01", capabilities=frozenset({"Bridge"}))
    new_switch = replace(HOST_SIDE[1], chassis=spine, port_id="swp1", port_descr="swp1")
    central.report("gpu-a17", [neighbour_reading(moved), neighbour_reading(new_switch)])
    central.report("ib-leaf-3", [neighbour_reading(replace(LEAF_SIDE[0], local_port="tpb5")), chassis_reading(LEAF)])
    code, out, _ = central.cli(capsys, "diff", "--json")
    assert (code, json.loads(out)) == (
        0,
        [
            {"kind": "switch_added", "element": "ib-spine-1", "detail": "leaf"},
            {"kind": "recabled", "element": "gpu-a17/tpa1", "detail": "was on ib-leaf-3, now on ib-spine-1"},
            {"kind": "cable_changed", "element": "gpu-a17/tpa0~ib-leaf-3", "detail": "ports tpa0-tpb0 -> tpa0-tpb5"},
        ],
    )


def test_changes_and_one_sided_links_become_events_and_a_gauge(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = db.make_engine(f"sqlite:///{data / 'fabricd.db'}")
    db.prepare(engine)
    admin = Storage.open(engine).tokens.create("admin", time.time(), note="watch")[1]
    engine.dispose()
    env = {"FABRICD_TOPOLOGY_WATCH_SECONDS": "0.2"}
    server = ServerProcess(data, extra=["--log-level", "warning"], env={**env, "FABRICD_LOG_FORMAT": "json"}).start()
    try:
        central = Central(server, admin)
        central.report("gpu-a17", [neighbour_reading(n) for n in HOST_SIDE])
        central.report("ib-leaf-3", [neighbour_reading(LEAF_SIDE[0]), chassis_reading(LEAF)])
        wanted = {"problem": 1.0, "switch_added": 1.0, "host_added": 1.0, "link_added": 2.0}
        deadline = time.monotonic() + 30
        while (gauges := _gauges(server)) != wanted:
            assert time.monotonic() < deadline, gauges
            time.sleep(0.2)
        time.sleep(1.0)  # several more rounds: each change is logged once, when it appears
    finally:
        server.stop()
    events = [json.loads(line) for line in server.log.read_text().splitlines() if '"topology change"' in line]
    assert sorted((e["kind"], e["element"], e["detail"]) for e in events) == [
        ("host_added", "gpu-a17", "tpa0, tpa1"),
        ("link_added", "gpu-a17/tpa0~ib-leaf-3", "tpa0-tpb0"),
        ("link_added", "gpu-a17/tpa1~ib-leaf-3", "tpa1-tpb1"),
        ("problem", "", "gpu-a17 tpa1 ~ ib-leaf-3 tpb1: seen from gpu-a17 only"),
        ("switch_added", "ib-leaf-3", "leaf"),
    ]


def _gauges(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith("fabricd_topology_changes{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = float(line.rsplit(" ", 1)[1])
    return out


def _active(central: Central) -> httpx.Response:
    return httpx.get(
        f"{central.server.url}/api/v1/topology",
        headers={"Authorization": f"Bearer {central.admin}"},
        timeout=10,
    )


def test_detection_localizes_over_the_discovered_graph_or_the_pushed_one_with_it(central: Central) -> None:
    assert _active(central).status_code == 404  # neither pushed nor discovered
    central.report("gpu-a17", [neighbour_reading(n) for n in HOST_SIDE])
    central.report("ib-leaf-3", [neighbour_reading(n) for n in LEAF_SIDE] + [chassis_reading(LEAF)])
    assert _links(_active(central).json()) == _links(central.discovered()["document"])  # nothing pushed

    # A pushed document names gpu-a17's port by its RDMA device and knows a spine LLDP does not
    # hear: it is kept as pushed; what only discovery knows (gpu-b02, its cable) is added.
    pushed = {
        "version": 1,
        "link_layer": "roce",
        "elements": [
            {"id": "ib-leaf-3", "type": "switch", "tier": "leaf"},
            {"id": "ib-spine-1", "type": "switch", "tier": "spine"},
            {"id": "gpu-a17/mlx5_0", "type": "hca_port", "node": "gpu-a17", "device": "mlx5_0", "netdev": "tpa0"},
        ],
        "links": [{"a": "gpu-a17/mlx5_0", "b": "ib-leaf-3"}, {"a": "ib-leaf-3", "b": "ib-spine-1"}],
    }
    put = httpx.put(
        f"{central.server.url}/api/v1/topology",
        json=pushed,
        headers={"Authorization": f"Bearer {central.admin}"},
        timeout=10,
    )
    assert put.status_code == 200, put.text
    other = replace(HOST_SIDE[0], local_port="eth0")  # synthetic, from the captures: a second host
    central.report("gpu-b02", [neighbour_reading(replace(other, port_id="tpb7", port_descr="tpb7"))])
    central.report(
        "ib-leaf-3",
        [neighbour_reading(n) for n in LEAF_SIDE]
        + [neighbour_reading(replace(LEAF_SIDE[0], local_port="tpb7", chassis=B02, port_id="eth0", port_descr="eth0"))]
        + [chassis_reading(LEAF)],
    )
    active = _active(central).json()
    assert _links(active) == {
        "gpu-a17/mlx5_0~ib-leaf-3": [],
        "ib-leaf-3~ib-spine-1": [],
        "gpu-b02/eth0~ib-leaf-3": [{"a_port": "eth0", "b_port": "tpb7"}],
    }
