"""The topology LLDP neighbours describe (``fabricd topology discover --lldp``).

Each report is one machine's ``lldpctl -f json`` (and, when known, its own chassis from ``lldpcli
show chassis -f json``). What is a switch comes from LLDP itself, never from a name: a chassis that
says it bridges or routes (enabled capability Bridge or Router) is a switch, any other a host. A
switch with hosts cabled to it is a leaf, the others spines. A host's port is its RDMA device when
the report maps the interface to one (RoCE: sysfs ``gid_attrs/ndevs``), else the interface itself.

Cables are checked from both ends when both ends report: a link heard from one side only, or whose
two ends disagree about the ports, is listed in ``LldpTopology.problems``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fabricd.model import Reading
from fabricd.parsers.lldp import LldpChassis, LldpNeighbour
from fabricd.topology.model import LEAF, SPINE, HcaPort, Switch, Topology


@dataclass(frozen=True, slots=True)
class LldpReport:
    node: str  # the reporting machine (the agent's node name)
    neighbours: tuple[LldpNeighbour, ...]
    chassis: LldpChassis | None = None  # its own chassis, when read
    devices: Mapping[str, str] = field(default_factory=dict)  # interface -> RDMA device (RoCE)

    @property
    def forwards(self) -> bool:
        return self.chassis is not None and self.chassis.forwards


def report_from_readings(node: str, readings: Iterable[Reading]) -> LldpReport:
    """One machine's report from its lldp collector readings (``neighbor_info``, ``chassis_info``)."""
    neighbours: list[LldpNeighbour] = []
    chassis: LldpChassis | None = None
    for r in readings:
        labels = dict(r.labels)
        if r.source != "lldp" or not labels.get("chassis"):
            continue
        seen = LldpChassis(
            labels["chassis"],
            labels.get("chassis_id", ""),
            mgmt_ip=tuple(ip for ip in labels.get("mgmt_ip", "").split(",") if ip),
            capabilities=frozenset(c for c in labels.get("capabilities", "").split(",") if c),
        )
        if r.name == "chassis_info":
            chassis = seen
        elif r.name == "neighbor_info":
            port_id, port_type = labels.get("port_id", ""), labels.get("port_id_type", "")
            neighbours.append(LldpNeighbour(r.device, seen, port_id, port_type, labels.get("port_descr", "")))
    return LldpReport(node, tuple(neighbours), chassis)


@dataclass(slots=True)
class LldpTopology:
    topology: Topology
    problems: list[str] = field(default_factory=list)  # one-sided links, cables whose ends disagree


@dataclass(frozen=True, slots=True)
class _Half:
    """One side's view of a cable: (its element, its port) -> (far element, far port)."""

    here: str
    here_port: str
    there: str
    there_port: str


def from_lldp(reports: Iterable[LldpReport], link_layer: str = "roce") -> LldpTopology:
    reports = list(reports)
    by_node = {r.node: r for r in reports}
    switches = {r.node for r in reports if r.forwards}
    switches |= {n.chassis.name for r in reports for n in r.neighbours if n.chassis.forwards}
    hosts = ({r.node for r in reports} | {n.chassis.name for r in reports for n in r.neighbours}) - switches
    leaves = {n.chassis.name for r in reports if r.node in hosts for n in r.neighbours if n.chassis.name in switches}
    leaves |= {r.node for r in reports if r.node in switches for n in r.neighbours if n.chassis.name in hosts}
    topo = Topology(link_layer=link_layer)
    for sw in sorted(switches):
        topo.add_switch(Switch(sw, LEAF if sw in leaves else SPINE))
    halves: dict[tuple[str, str], _Half] = {}  # (element, port) -> what that side heard
    for r in reports:
        for n in r.neighbours:
            halves[(r.node, n.local_port)] = _Half(r.node, n.local_port, n.chassis.name, n.port_name)
    out = LldpTopology(topo)
    for half in halves.values():
        if half.here in hosts and half.there in switches:
            _host_link(topo, by_node, half.here, half.here_port, half.there, half.there_port)
        elif half.here in switches and half.there in hosts:
            _host_link(topo, by_node, half.there, half.there_port, half.here, half.here_port)
        elif half.here in switches and half.there in switches:
            topo.connect_switches(half.here, half.there, (half.here_port, half.there_port))
        else:
            out.problems.append(f"{half.here} {half.here_port} hears host {half.there}: hosts cabled back to back")
            continue
        if half.there in by_node:  # the far end reports too: it must have heard this side
            back = halves.get((half.there, half.there_port))
            if back is None:
                out.problems.append(
                    f"{half.here} {half.here_port} ~ {half.there} {half.there_port}: seen from {half.here} only"
                )
            elif (back.there, back.there_port) != (half.here, half.here_port):
                out.problems.append(
                    f"{half.there} {half.there_port}: {half.here} says it is cabled to its {half.here_port}, "
                    f"{half.there} hears {back.there} {back.there_port}"
                )
    return out


def _host_link(
    topo: Topology, by_node: Mapping[str, LldpReport], host: str, iface: str, switch: str, switch_port: str
) -> None:
    report = by_node.get(host)
    device = report.devices.get(iface, iface) if report is not None else iface
    hca = HcaPort(f"{host}/{device}", host, device, netdev=iface)
    topo.add_hca_port(hca)
    topo.connect_host(hca.id, switch, (iface, switch_port))
