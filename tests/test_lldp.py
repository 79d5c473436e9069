"""LLDP: lldpd's JSON parsed (both of its shapes), the topology it describes, and the lldp collector
reading a real lldpd on both ends of two cables between network namespaces (issue 16 §2)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from collectors.lldp import LldpCollector, LldpOptions
from fabricd.collector import CollectorContext
from fabricd.parsers.common import Problem
from fabricd.parsers.lldp import LldpChassis, LldpNeighbour, parse_lldp_chassis_json, parse_lldpctl_json
from fabricd.topology import ElementKind
from fabricd.topology.lldp import LldpReport, from_lldp, report_from_readings
from tests.helpers import CASES, need_binary, need_root
from tests.support.lab import delete_namespace, stale_namespaces

LLDP = CASES / "lldp"
DESCR = "Debian GNU/Linux 12 (bookworm) Linux 6.18.44-fc-v857 #1 SMP PREEMPT_DYNAMIC @0 x86_64"
LEAF = LldpChassis(
    "ib-leaf-3", "b2:85:2b:42:fd:ff", DESCR, ("10.77.0.2", "fe80::b085:2bff:fe42:fdff"), frozenset({"Router"})
)
HOST = LldpChassis(
    "gpu-a17", "aa:36:32:f7:09:39", "", ("10.77.0.1", "fe80::a836:32ff:fef7:939"), frozenset({"Station"})
)


def neighbours(name: str) -> list[LldpNeighbour]:
    parsed = parse_lldpctl_json((LLDP / name).read_text())
    assert parsed.problems == []
    return parsed.neighbours


def test_one_neighbour_is_an_object_several_a_list_both_read() -> None:
    assert neighbours("lldpctl_one_neighbour.json") == [LldpNeighbour("tpa0", LEAF, "tpb0", "ifname", "tpb0")]
    assert neighbours("lldpctl_two_neighbours.json") == [
        LldpNeighbour("tpa0", LEAF, "tpb0", "ifname", "tpb0"),
        LldpNeighbour("tpa1", LEAF, "tpb1", "ifname", "tpb1"),
    ]
    assert neighbours("lldpctl_no_neighbour.json") == []
    assert LEAF.forwards and not HOST.forwards


def test_the_local_chassis() -> None:
    chassis, problems = parse_lldp_chassis_json((LLDP / "lldpcli_show_chassis.json").read_text())
    assert (chassis, problems) == (replace(HOST, descr="gpu-a17 host"), [])


def test_a_mac_port_id_names_the_port_by_its_description() -> None:
    # lldpd's default port id subtype is the MAC (the first capture here, before `portidsubtype ifname`).
    n = LldpNeighbour("eth0", LEAF, "b2:85:2b:42:fd:ff", "mac", "swp7")
    assert (n.port_name, replace(n, port_id_type="ifname", port_id="swp7").port_name) == ("swp7", "swp7")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", Problem(0, "empty output")),
        (
            "lldpctl: unable to connect",
            Problem(1, "not JSON: Expecting value: line 1 column 1 (char 0)", "lldpctl: unable to connect"),
        ),
        ('{"local-chassis": {}}', Problem(0, "no 'lldp' object: not lldpctl -f json output")),
        (
            '{"lldp": {"interface": {"eth0": {"via": "LLDP"}}}}',
            Problem(0, "interface eth0: no chassis or port id", '{"via": "LLDP"}'),
        ),
    ],
)
def test_unreadable_output_is_a_problem_not_a_crash(text: str, problem: Problem) -> None:
    assert parse_lldpctl_json(text).problems == [problem]


def _reports(switch_side: list[LldpNeighbour]) -> list[LldpReport]:
    return [
        LldpReport("gpu-a17", tuple(neighbours("lldpctl_two_neighbours.json"))),
        LldpReport("ib-leaf-3", tuple(switch_side)),
    ]


def test_both_ends_agree_one_host_two_cables_to_a_leaf() -> None:
    found = from_lldp(_reports(neighbours("lldpctl_switch_side.json")))
    topo = found.topology
    assert found.problems == []
    assert {k: v.ports for k, v in topo.links.items()} == {
        "gpu-a17/tpa0~ib-leaf-3": (("tpa0", "tpb0"),),
        "gpu-a17/tpa1~ib-leaf-3": (("tpa1", "tpb1"),),
    }
    assert (topo.element("ib-leaf-3").kind, topo.switches["ib-leaf-3"].tier) == (ElementKind.SWITCH, "leaf")  # type: ignore[union-attr]
    assert topo.element("gpu-a17").kind is ElementKind.NODE  # type: ignore[union-attr]
    assert topo.hca_ports["gpu-a17/tpa1"].netdev == "tpa1"


def test_a_link_heard_from_one_side_and_a_cable_whose_ends_disagree_are_reported() -> None:
    tpb0, _ = neighbours("lldpctl_switch_side.json")
    one_sided = from_lldp(_reports([tpb0]))
    assert one_sided.problems == ["gpu-a17 tpa1 ~ ib-leaf-3 tpb1: seen from gpu-a17 only"]
    # Synthetic, derived from the capture: the leaf hears gpu-a17's tpa1 on its tpb0 (a moved cable).
    moved = from_lldp(_reports([replace(tpb0, port_id="tpa1", port_descr="tpa1")]))
    assert moved.problems == [
        "ib-leaf-3 tpb0: gpu-a17 says it is cabled to its tpa0, ib-leaf-3 hears gpu-a17 tpa1",
        "gpu-a17 tpa1 ~ ib-leaf-3 tpb1: seen from gpu-a17 only",
        "gpu-a17 tpa1: ib-leaf-3 says it is cabled to its tpb0, gpu-a17 hears ib-leaf-3 tpb1",
    ]


# --- a real lldpd on both ends ------------------------------------------------------------------


PREFIX = "fdlp"
HOST_NS, LEAF_NS = f"{PREFIX}-host", f"{PREFIX}-leaf"


def _ns(ns: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=20, check=True)


def _lldpcli(ns: str, socket: Path, *words: str, seconds: float = 10.0) -> None:
    """Run an lldpcli command, retried while the daemon is still starting (its socket may exist
    before it answers)."""
    deadline = time.monotonic() + seconds
    while True:
        proc = subprocess.run(
            ["ip", "netns", "exec", ns, "lldpcli", "-u", str(socket), *words],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if proc.returncode == 0:
            return
        assert time.monotonic() < deadline, f"lldpcli {' '.join(words)}: {proc.stderr.strip()}"
        time.sleep(0.2)


@pytest.fixture
def cabled() -> Iterator[dict[str, Path]]:
    """Two namespaces, two veth cables (h0-l0, h1-l1), an lldpd in each; torn down even on failure."""
    need_root()
    for tool in ("ip", "lldpd", "lldpctl", "lldpcli"):
        need_binary(tool)
    # In /tmp itself: lldpd could not be reached through a socket under pytest's 0700 tmp_path.
    sockets = {ns: Path(f"/tmp/{ns}-{os.getpid()}.sock") for ns in (HOST_NS, LEAF_NS)}
    configs = {ns: Path(f"/tmp/{ns}-{os.getpid()}.conf") for ns in (HOST_NS, LEAF_NS)}
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        for ns in sockets:
            subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
        for i in (0, 1):
            subprocess.run(
                ["ip", "link", "add", f"{PREFIX}h{i}", "type", "veth", "peer", "name", f"{PREFIX}l{i}"], check=True
            )
            subprocess.run(["ip", "link", "set", f"{PREFIX}h{i}", "netns", HOST_NS], check=True)
            subprocess.run(["ip", "link", "set", f"{PREFIX}l{i}", "netns", LEAF_NS], check=True)
            _ns(HOST_NS, "ip", "link", "set", f"{PREFIX}h{i}", "up")
            _ns(LEAF_NS, "ip", "link", "set", f"{PREFIX}l{i}", "up")
        _ns(LEAF_NS, "sysctl", "-qw", "net.ipv4.ip_forward=1")  # a routed leaf: lldpd announces Router
        for ns, sock in sockets.items():
            # Settings in a file given with -O: lldpd starts paused and applies them before its first
            # frame (lldpd(8)); set afterwards, the first frames carry the machine's hostname.
            configs[ns].write_text(
                f"configure system hostname {'gpu-a17' if ns == HOST_NS else 'ib-leaf-3'}\n"
                "configure lldp portidsubtype ifname\n"
                "configure lldp tx-interval 1\n"
            )
            side = "h" if ns == HOST_NS else "l"
            argv = ["ip", "netns", "exec", ns, "lldpd", "-d", "-u", str(sock), "-O", str(configs[ns])]
            argv += ["-I", f"{PREFIX}{side}0,{PREFIX}{side}1"]
            daemons.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for ns, sock in sockets.items():
            _lldpcli(ns, sock, "show", "chassis")  # up and answering
        yield sockets
    finally:
        for proc in daemons:
            proc.kill()
            proc.wait(timeout=10)
        for ns in (HOST_NS, LEAF_NS):
            with contextlib.suppress(subprocess.CalledProcessError):
                delete_namespace(ns)
        for path in [*sockets.values(), *configs.values()]:
            path.unlink(missing_ok=True)
        assert stale_namespaces(PREFIX) == []


def _collector(ns: str, sock: Path) -> LldpCollector:
    run = ["ip", "netns", "exec", ns]
    opts = LldpOptions(
        command=[*run, "lldpctl", "-u", str(sock), "-f", "json"],
        chassis_command=[*run, "lldpcli", "-u", str(sock), "show", "chassis", "-f", "json"],
    )
    return LldpCollector(CollectorContext(node=ns, options=opts))


async def _heard(collector: LldpCollector, count: int, seconds: float = 30.0) -> list[object]:
    """Scrape until lldpd has heard ``count`` neighbours, all with their configured names and no
    other (a frame sent before the settings applied would be a second one: LLDP is periodic)."""
    deadline = time.monotonic() + seconds
    while True:
        readings = list(await collector.collect())
        named = [r for r in readings if r.name == "neighbor_info"]
        labels = [dict(r.labels) for r in named]
        if len(named) == count and all(
            x["port_id_type"] == "ifname" and x["chassis"] in {"gpu-a17", "ib-leaf-3"} for x in labels
        ):
            return readings
        assert time.monotonic() < deadline, f"after {seconds:g} s lldpd reports {readings}"
        await asyncio.sleep(0.5)


@pytest.mark.root
@pytest.mark.slow
def test_the_collector_reads_a_real_lldpd_and_the_topology_matches_the_cables(cabled: dict[str, Path]) -> None:
    async def scrape() -> dict[str, list[object]]:
        return {ns: await _heard(_collector(ns, sock), 2) for ns, sock in cabled.items()}

    readings = asyncio.run(scrape())
    host = [r for r in readings[HOST_NS] if r.name == "neighbor_info"]  # type: ignore[attr-defined]
    assert sorted((r.device, dict(r.labels)["chassis"], dict(r.labels)["port"]) for r in host) == [  # type: ignore[attr-defined]
        ("fdlph0", "ib-leaf-3", "fdlpl0"),
        ("fdlph1", "ib-leaf-3", "fdlpl1"),
    ]
    chassis = {
        dict(r.labels)["chassis"]: dict(r.labels)["capabilities"]
        for rs in readings.values()
        for r in rs
        if r.name == "chassis_info"
    }  # type: ignore[attr-defined]
    assert chassis == {"gpu-a17": "Station", "ib-leaf-3": "Router"}
    reports = [
        report_from_readings(node, rs)
        for node, rs in (("gpu-a17", readings[HOST_NS]), ("ib-leaf-3", readings[LEAF_NS]))
    ]  # type: ignore[arg-type]
    found = from_lldp(reports)
    assert found.problems == []
    assert {k: v.ports for k, v in found.topology.links.items()} == {
        "gpu-a17/fdlph0~ib-leaf-3": (("fdlph0", "fdlpl0"),),
        "gpu-a17/fdlph1~ib-leaf-3": (("fdlph1", "fdlpl1"),),
    }
    assert found.topology.switches["ib-leaf-3"].tier == "leaf"


def test_lldpd_not_running_fails_the_scrape_with_the_reason(tmp_path: Path) -> None:
    need_binary("lldpctl")
    opts = LldpOptions(command=["lldpctl", "-u", str(tmp_path / "none.sock"), "-f", "json"], chassis_command=[])
    collector = LldpCollector(CollectorContext(node="n", options=opts))
    with pytest.raises(RuntimeError) as exc:
        asyncio.run(collector.collect())
    message = str(exc.value)
    assert message.startswith(f"lldpctl -u {tmp_path / 'none.sock'} -f json exited 1: ")
    assert json.dumps(message)  # one line of text, whatever lldpctl printed
