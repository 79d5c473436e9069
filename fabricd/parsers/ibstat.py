"""``ibstat`` and ``ibstatus`` output: the management node's own HCA ports (state, rate, LID).

``ibstat`` spells states as words (``State: Active``), ``ibstatus`` as ``<id>: NAME``
(``state: 4: ACTIVE``); both become the IBA PortInfo PortState / PortPhysicalState ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# ibstat spells states as words; sysfs and ibstatus as "<id>: NAME" (IBA PortInfo PortState /
# PortPhysicalState enumerations). Map the words to the same ids.
PORT_STATES = {"down": 1, "initializing": 2, "init": 2, "armed": 3, "active": 4, "activedefer": 5}
PHYS_STATES = {
    "sleep": 1,
    "polling": 2,
    "disabled": 3,
    "portconfigurationtraining": 4,
    "linkup": 5,
    "linkerrorrecovery": 6,
    "phytest": 7,
}


@dataclass(frozen=True, slots=True)
class IbPortStatus:
    device: str
    port: int
    state: str = ""
    state_id: int | None = None
    phys_state: str = ""
    phys_state_id: int | None = None
    rate_gbps: float | None = None
    link_layer: str = ""
    lid: int | None = None
    port_guid: str = ""


@dataclass(frozen=True, slots=True)
class IbstatResult:
    ports: list[IbPortStatus]
    errors: list[str]  # e.g. ibpanic lines: the listing is incomplete


_IBSTAT_CA = re.compile(r"CA '(?P<dev>[^']*)'")
_IBSTAT_PORT = re.compile(r"Port (?P<port>\d{1,20}):")


def parse_ibstat(text: str) -> IbstatResult:
    """``ibstat`` output (tab- or space-indented). ``ibpanic:`` lines are returned as errors."""
    ports: list[IbPortStatus] = []
    errors: list[str] = []
    device, port = "", None
    fields: dict[str, str] = {}
    for line in [*text.splitlines(), "CA ''"]:  # sentinel flushes the last port
        stripped = line.strip()
        ca, new_port = _IBSTAT_CA.fullmatch(stripped), _IBSTAT_PORT.fullmatch(stripped)
        if (ca or new_port) and port is not None:
            ports.append(_ibstat_port(device, port, fields))
            port, fields = None, {}
        if ca:
            device = ca["dev"]
        elif new_port:
            port = int(new_port["port"])
        elif stripped.startswith("ibpanic:"):
            errors.append(stripped)
        elif port is not None and ":" in stripped:
            key, _, value = stripped.partition(":")
            fields[key.strip().lower()] = value.strip()
    return IbstatResult(ports, errors)


def _ibstat_port(device: str, port: int, f: dict[str, str]) -> IbPortStatus:
    state, phys = f.get("state", ""), f.get("physical state", "")
    rate = f.get("rate", "")
    return IbPortStatus(
        device,
        port,
        state,
        PORT_STATES.get(state.lower()),
        phys,
        PHYS_STATES.get(phys.lower()),
        float(rate) if re.fullmatch(r"\d{1,20}(\.\d{1,20})?", rate) else None,
        f.get("link layer", ""),
        int(f["base lid"]) if re.fullmatch(r"[0-9]{1,20}", f.get("base lid", "")) else None,
        f.get("port guid", ""),
    )


_IBSTATUS_HEAD = re.compile(r"Infiniband device '(?P<dev>[^']*)' port (?P<port>\d{1,20}) status:")
_ID_NAME = re.compile(r"(?P<id>\d{1,20}):\s*(?P<name>\S+)")


def parse_ibstatus(text: str) -> list[IbPortStatus]:
    """``ibstatus`` output: ``state: 4: ACTIVE``, ``rate: 200 Gb/sec (4X HDR)``, ``base lid: 0x33bf``."""
    ports: list[IbPortStatus] = []
    head: tuple[str, int] | None = None
    fields: dict[str, str] = {}
    for line in [*text.splitlines(), "Infiniband device '' port 0 status:"]:
        m = _IBSTATUS_HEAD.fullmatch(line.strip())
        if m:
            if head is not None:
                ports.append(_ibstatus_port(head[0], head[1], fields))
            head, fields = (m["dev"], int(m["port"])), {}
        elif ":" in line:
            key, _, value = line.strip().partition(":")
            fields[key.strip().lower()] = value.strip()
    return ports


def _ibstatus_port(device: str, port: int, f: dict[str, str]) -> IbPortStatus:
    state, phys = _ID_NAME.fullmatch(f.get("state", "")), _ID_NAME.fullmatch(f.get("phys state", ""))
    rate = re.match(r"(\d{1,20}(?:\.\d{1,20})?)\s*Gb/sec", f.get("rate", ""))
    lid = f.get("base lid", "")
    return IbPortStatus(
        device,
        port,
        state["name"] if state else "",
        int(state["id"]) if state else None,
        phys["name"] if phys else "",
        int(phys["id"]) if phys else None,
        float(rate.group(1)) if rate else None,
        f.get("link_layer", ""),
        int(lid, 0) if re.fullmatch(r"0x[0-9a-fA-F]+|[0-9]{1,20}", lid) else None,
        "",
    )
