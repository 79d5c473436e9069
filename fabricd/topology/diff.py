"""What changed between two topologies (``fabricd topology diff``): switches and hosts that came or
went, links added or removed, an HCA port recabled to another switch, a cable moved to other ports."""

from __future__ import annotations

from dataclasses import dataclass

from fabricd.topology.model import Topology


@dataclass(frozen=True, slots=True)
class Change:
    kind: (
        str  # switch_added, switch_removed, host_added, host_removed, link_added, link_removed, recabled, cable_changed
    )
    element: str
    detail: str = ""


def diff(old: Topology, new: Topology) -> list[Change]:
    """Changes from ``old`` (the stored topology) to ``new``, in a stable order."""
    out = [Change("switch_added", s, new.switches[s].tier) for s in sorted(new.switches.keys() - old.switches.keys())]
    out += [
        Change("switch_removed", s, old.switches[s].tier) for s in sorted(old.switches.keys() - new.switches.keys())
    ]
    out += [Change("host_added", n, _ports(new, n)) for n in sorted(new.nodes.keys() - old.nodes.keys())]
    out += [Change("host_removed", n, _ports(old, n)) for n in sorted(old.nodes.keys() - new.nodes.keys())]
    recabled = set()
    for hca in sorted(old.hca_ports.keys() & new.hca_ports.keys()):
        was, now = old.uplink(hca), new.uplink(hca)
        if was is not None and now is not None and was.b != now.b:
            recabled |= {was.id, now.id}
            out.append(Change("recabled", hca, f"was on {was.b}, now on {now.b}"))
    for link_id in sorted(new.links.keys() - old.links.keys() - recabled):
        out.append(Change("link_added", link_id, _cables(new.links[link_id].ports)))
    for link_id in sorted(old.links.keys() - new.links.keys() - recabled):
        out.append(Change("link_removed", link_id, _cables(old.links[link_id].ports)))
    for link_id in sorted(old.links.keys() & new.links.keys()):
        was_ports, now_ports = old.links[link_id].ports, new.links[link_id].ports
        if was_ports and now_ports and was_ports != now_ports:
            out.append(Change("cable_changed", link_id, f"ports {_cables(was_ports)} -> {_cables(now_ports)}"))
    return out


def _ports(topo: Topology, node: str) -> str:
    return ", ".join(topo.hca_ports[h].device for h in topo.nodes[node])


def _cables(ports: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{a}-{b}" for a, b in ports) or "ports unknown"
