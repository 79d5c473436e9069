"""lldpd's JSON: ``lldpctl -f json`` (the neighbours heard on each local interface) and
``lldpcli show chassis -f json`` (this host's own chassis).

lldpd's ``json`` format shapes a value by how many there are: ``lldp.interface`` is one object keyed
by interface name when there is one neighbour and a list of such objects when there are several;
``mgmt-ip`` is a string for one address and a list for more (the SONiC capture in
netenglabs/suzieq#259 has the string form); with no neighbour at all ``lldp`` is empty. Both shapes
are read here. Captures: tests/cases/lldp/ (lldpd 1.0.16, Debian 12).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fabricd.parsers.common import Problem, problem


@dataclass(frozen=True, slots=True)
class LldpChassis:
    name: str  # the system name (LLDP sysName), lldpd's key for the chassis
    id: str  # the chassis id value (a MAC, usually)
    descr: str = ""
    mgmt_ip: tuple[str, ...] = ()
    capabilities: frozenset[str] = frozenset()  # the enabled ones: Bridge, Router, Station, ...

    @property
    def forwards(self) -> bool:
        """A switch or router (it bridges or routes), as the chassis itself says."""
        return bool(self.capabilities & {"Bridge", "Router"})


@dataclass(frozen=True, slots=True)
class LldpNeighbour:
    """One neighbour heard on one local interface."""

    local_port: str  # our interface
    chassis: LldpChassis
    port_id: str  # the neighbour's port id value (an interface name when its subtype is ifname)
    port_id_type: str  # ifname, mac, local, ...
    port_descr: str = ""
    via: str = "LLDP"

    @property
    def port_name(self) -> str:
        """The far port's interface name: the port id when it is one (subtype ifname), else the port
        description (lldpd's default port id is the MAC, its description the interface name)."""
        if self.port_id_type == "ifname" or not self.port_descr:
            return self.port_id
        return self.port_descr


@dataclass(slots=True)
class LldpNeighbours:
    neighbours: list[LldpNeighbour] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def parse_lldpctl_json(text: str) -> LldpNeighbours:
    """The neighbours in ``lldpctl -f json`` output; never raises (unreadable parts are problems)."""
    out = LldpNeighbours()
    doc = _load(text, out.problems)
    if doc is None:
        return out
    lldp = doc.get("lldp")
    if not isinstance(lldp, dict):
        out.problems.append(problem(0, "no 'lldp' object: not lldpctl -f json output"))
        return out
    for entry in _as_list(lldp.get("interface")):
        if not isinstance(entry, dict):
            out.problems.append(problem(0, "an interface entry is not an object", repr(entry)))
            continue
        for local, info in entry.items():
            neighbour = _neighbour(str(local), info)
            if neighbour is None:
                out.problems.append(problem(0, f"interface {local}: no chassis or port id", json.dumps(info)))
            else:
                out.neighbours.append(neighbour)
    return out


def parse_lldp_chassis_json(text: str) -> tuple[LldpChassis | None, list[Problem]]:
    """This host's chassis from ``lldpcli show chassis -f json``."""
    problems: list[Problem] = []
    doc = _load(text, problems)
    if doc is None:
        return None, problems
    local = doc.get("local-chassis")
    chassis = _chassis(local.get("chassis")) if isinstance(local, dict) else None
    if chassis is None:
        problems.append(problem(0, "no 'local-chassis' with a named chassis: not lldpcli show chassis -f json"))
    return chassis, problems


def _load(text: str, problems: list[Problem]) -> dict[str, Any] | None:
    if not text.strip():
        problems.append(problem(0, "empty output"))
        return None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        problems.append(problem(getattr(exc, "lineno", 0), f"not JSON: {exc}", text.splitlines()[0]))
        return None
    if not isinstance(doc, dict):
        problems.append(problem(0, "not a JSON object"))
        return None
    return doc


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _neighbour(local: str, info: Any) -> LldpNeighbour | None:
    if not isinstance(info, dict):
        return None
    chassis = _chassis(info.get("chassis"))
    port = info.get("port")
    if not isinstance(port, dict):
        return None
    port_id = port.get("id")
    if chassis is None or not isinstance(port_id, dict) or not port_id.get("value"):
        return None
    return LldpNeighbour(
        local,
        chassis,
        str(port_id["value"]),
        str(port_id.get("type", "")),
        str(port.get("descr", "")),
        str(info.get("via", "LLDP")),
    )


def _chassis(value: Any) -> LldpChassis | None:
    """lldpd keys the chassis object by its system name."""
    if not isinstance(value, dict) or not value:
        return None
    name, body = next(iter(value.items()))
    if not isinstance(body, dict):
        return None
    cid = body.get("id")
    caps = frozenset(
        str(c.get("type")) for c in _as_list(body.get("capability")) if isinstance(c, dict) and c.get("enabled")
    )
    return LldpChassis(
        str(name),
        str(cid.get("value", "")) if isinstance(cid, dict) else "",
        str(body.get("descr", "")),
        tuple(str(ip) for ip in _as_list(body.get("mgmt-ip"))),
        caps,
    )
