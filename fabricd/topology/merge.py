"""One topology from several discovery sources (ibnetdiscover for the InfiniBand fabric, LLDP for
the Ethernet one): the union of their switches, HCA ports and links. A switch seen by two sources
keeps the first one's tier unless a later one knows it as a leaf (it has hosts)."""

from __future__ import annotations

from collections.abc import Sequence

from fabricd.topology.model import LEAF, Switch, Topology


def merge(parts: Sequence[Topology]) -> Topology:
    if len(parts) == 1:
        return parts[0]
    layers = {p.link_layer for p in parts}
    out = Topology(link_layer=layers.pop() if len(layers) == 1 else "roce")
    for part in parts:
        for sw in part.switches.values():
            old = out.switches.get(sw.id)
            if old is None:
                out.add_switch(sw)
            elif sw.tier == LEAF and old.tier != LEAF:
                out.switches[sw.id] = Switch(sw.id, LEAF, old.guid or sw.guid)
        for hca in part.hca_ports.values():
            out.add_hca_port(hca)
    for part in parts:
        for link in part.links.values():
            connect = out.connect_host if link.kind == "host" else out.connect_switches
            for cable in link.ports or (None,):
                connect(link.a, link.b, cable)
    return out
