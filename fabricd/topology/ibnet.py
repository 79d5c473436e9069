"""The ``Topology`` that ``ibnetdiscover`` output describes (``fabricd.parsers.ibnetdiscover`` reads
both formats: ``-p`` and the topology file)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from fabricd.model import Reading
from fabricd.parsers.ibnetdiscover import IbnetEnd, IbnetPort, parse_ibnetdiscover
from fabricd.topology.model import LEAF, SPINE, HcaPort, Switch, Topology


def _clean(desc: str) -> str:
    return re.sub(r"\s+", "_", desc.strip())


def ca_port_id(desc: str, guid: str) -> tuple[str, str]:
    """(node, device) of a CA from its node description: ``'worker20 mlx5_3'`` -> worker20, mlx5_3."""
    words = desc.split(None, 1)
    if not words:
        return guid, "hca"
    return words[0], _clean(words[1]) if len(words) > 1 else "hca"


def switch_ids(ports: Iterable[IbnetPort]) -> dict[str, str]:
    """Switch guid -> element id (its description; the guid is appended when two share one)."""
    descs: dict[str, str] = {}
    for p in ports:
        for end in (p.local, p.remote):
            if end is not None and end.type == "SW":
                descs.setdefault(end.guid, _clean(end.desc) or end.guid)
    counts: dict[str, int] = {}
    for desc in descs.values():
        counts[desc] = counts.get(desc, 0) + 1
    return {guid: desc if counts[desc] == 1 else f"{desc}-{guid}" for guid, desc in descs.items()}


def ca_ids(ports: Iterable[IbnetPort]) -> dict[str, tuple[str, str]]:
    """CA port guid -> (node, device), one id per port. ``ca_port_id`` names them from the node
    description; when several ports share a description, the ports of one dual-port CA (distinct
    port numbers) get ``<device>-<port>``, and CAs whose description names no host (several port
    1s: rdma-core's man-page fabric, every CA ``MT23108 InfiniHost Mellanox Technologies``) get the
    port guid appended to the node, as ``switch_ids`` does for switches."""
    ends: dict[str, IbnetEnd] = {}
    for p in ports:
        for end in (p.local, p.remote):
            if end is not None and end.type == "CA":
                ends.setdefault(end.guid, end)
    groups: dict[tuple[str, str], list[IbnetEnd]] = {}
    for end in ends.values():
        groups.setdefault(ca_port_id(end.desc, end.guid), []).append(end)
    out: dict[str, tuple[str, str]] = {}
    for (node, device), members in groups.items():
        numbers = [e.port for e in members]
        for e in members:
            if len(members) == 1:
                out[e.guid] = (node, device)
            elif len(set(numbers)) == len(numbers):
                out[e.guid] = (node, f"{device}-{e.port}")
            else:
                out[e.guid] = (f"{node}-{e.guid}", device)
    return out


def end_id(end: IbnetEnd, switches: dict[str, str], cas: dict[str, tuple[str, str]] | None = None) -> str:
    """Element id of one end: a switch id, or the ``node/device`` HCA port id (``cas``: from
    ``ca_ids``, which keeps CAs sharing a description apart)."""
    if end.type == "SW":
        return switches[end.guid]
    node, device = (cas or {}).get(end.guid) or ca_port_id(end.desc, end.guid)
    return f"{node}/{device}"


def from_ibnetdiscover(text: str) -> Topology:
    """Topology from ``ibnetdiscover`` (``-p`` or the topology file): switches cabled to a CA are
    leaves, the others spines."""
    return from_ports(parse_ibnetdiscover(text).ports)


def from_ports(ports: Sequence[IbnetPort]) -> Topology:
    """Topology of parsed ibnetdiscover ports (the text's, or the ``ibfabric`` collector's readings)."""
    ids = switch_ids(ports)
    cas = ca_ids(ports)
    leaves = {
        e.guid
        for p in ports
        if p.remote is not None
        for e, other in ((p.local, p.remote), (p.remote, p.local))
        if e.type == "SW" and other.type == "CA"
    }
    topo = Topology(link_layer="infiniband")
    for guid, sid in ids.items():
        topo.add_switch(Switch(sid, LEAF if guid in leaves else SPINE, guid))
    for p in ports:
        for end in (p.local, p.remote):
            if end is not None and end.type == "CA":
                node, device = cas[end.guid]
                topo.add_hca_port(HcaPort(f"{node}/{device}", node, device, end.port, end.guid))
    for p in ports:
        if p.remote is not None:
            _cable(topo, p.local, p.remote, ids, cas)
    return topo


def _cable(topo: Topology, a: IbnetEnd, b: IbnetEnd, ids: dict[str, str], cas: dict[str, tuple[str, str]]) -> None:
    if a.type == "CA" and b.type == "SW":
        topo.connect_host(end_id(a, ids, cas), ids[b.guid], (a.port, b.port))
    elif a.type == "SW" and b.type == "CA":
        topo.connect_host(end_id(b, ids, cas), ids[a.guid], (b.port, a.port))
    elif a.type == "SW" and b.type == "SW":
        topo.connect_switches(ids[a.guid], ids[b.guid], (a.port, b.port))
    # CA-CA back-to-back cables carry no switch: not part of the switched fabric model.


def problems(ports: Sequence[IbnetPort]) -> list[str]:
    """Cables the two ends describe differently: ``ibnetdiscover`` lists a cable from both of its
    ends (each node's own port lines), so an end whose node is listed must list the cable back. A
    far node that lists other ports but not this one: the cable is seen from one side only; a far
    port that names another peer: the two ends disagree (a cable moved during the sweep, or two
    reports of the fabric merged)."""
    switches, cas = switch_ids(ports), ca_ids(ports)
    listed = {p.local.guid for p in ports}
    by_port = {(p.local.guid, p.local.port): p for p in ports}
    out = []
    for p in ports:
        far = p.remote
        if far is None or far.guid not in listed:
            continue
        here = f"{end_id(p.local, switches, cas)} port {p.local.port}"
        there = f"{end_id(far, switches, cas)} port {far.port}"
        back = by_port.get((far.guid, far.port))
        if back is None or back.remote is None:
            out.append(f"{here} ~ {there}: seen from {end_id(p.local, switches, cas)} only (ibnetdiscover)")
        elif (back.remote.guid, back.remote.port) != (p.local.guid, p.local.port):
            other = f"{end_id(back.remote, switches, cas)} port {back.remote.port}"
            out.append(f"{there}: {here} says it is cabled to it, {there} names {other} (ibnetdiscover)")
    return out


# The ``ibfabric`` collector's ``cable_info`` readings carry each cabled port's ibnetdiscover line
# (collectors/ibfabric.py CABLE_LABELS): the central rebuilds the ports from them.
def ports_from_readings(readings: Iterable[Reading]) -> list[IbnetPort]:
    """The cabled ports of ``cable_info`` readings (other readings are skipped); LIDs are 0."""
    out = []
    for r in readings:
        labels = dict(r.labels)
        if r.source != "ibfabric" or r.name != "cable_info" or not r.port.isdigit():
            continue
        try:
            far_port = int(labels.get("remote_port", ""))
        except ValueError:
            continue
        here = IbnetEnd(labels.get("type", ""), 0, int(r.port), labels.get("guid", ""), labels.get("desc", ""))
        far = IbnetEnd(
            labels.get("remote_type", ""), 0, far_port, labels.get("remote_guid", ""), labels.get("remote_desc", "")
        )
        if here.guid and far.guid and {here.type, far.type} <= {"CA", "SW", "RT"}:
            out.append(IbnetPort(here, labels.get("width", ""), labels.get("speed", ""), far))
    return out
