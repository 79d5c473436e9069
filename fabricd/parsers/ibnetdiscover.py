"""``ibnetdiscover`` output, in both of its formats, as one list of ports.

- ``ibnetdiscover -p`` (``--ports``): one line per port, ``CA 134 1 0x7cfe... 4x EDR - SW 1719 10
  0x7cfe... ( 'o0001 HCA-1' - 'ib-i1l1s01' )``; unconnected ports end in the local description alone.
- The default topology file: per node a ``vendid=``/``devid=``/``sysimgguid=``/``switchguid=`` or
  ``caguid=`` block, a ``Switch 36 "S-<guid>" # "desc" base port 0 lid 9 lmc 0`` (or ``Ca``/``Rt``)
  line, then one line per *connected* port (``out_switch_port`` / ``out_ca_port`` in rdma-core
  ``infiniband-diags/ibnetdiscover.c``; the format is described in its man page, section TOPOLOGY FILE
  FORMAT). ``-g`` adds ``[ext N]`` and chassis lines, ``-f`` adds ``s=N w=N v=N``: both are accepted.

Both give the same ``IbnetPort`` values, so the topology code and the ``ibfabric`` collector read
either. GUIDs are the *port* GUIDs ``-p`` prints: a CA's from the parentheses of its port line, a
switch's from its ``switchguid=0x<node>(<port>)`` line (its node GUID when the switch's own block is
not in the text), written ``0x`` and 16 lowercase hex digits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fabricd.parsers.common import Problem, command_line, problem, tool_message


@dataclass(frozen=True, slots=True)
class IbnetEnd:
    type: str  # "CA", "SW" or "RT"
    lid: int
    port: int
    guid: str  # port GUID, "0x" + 16 hex digits, lowercase
    desc: str  # node description, padding stripped


@dataclass(frozen=True, slots=True)
class IbnetPort:
    """One port: its link width/speed and, when cabled, the far end."""

    local: IbnetEnd
    width: str  # "4x"
    speed: str  # "EDR"
    remote: IbnetEnd | None = None


@dataclass(frozen=True, slots=True)
class IbnetDiscovery:
    """Every port found, the format(s) seen (``"ports"`` for ``-p``, ``"topology"``) and what could not
    be read. No ports at all is a problem too: the caller cannot tell an empty fabric from a failure."""

    ports: list[IbnetPort] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def guid64(hex_digits: str) -> str:
    return "0x" + hex_digits.lower().removeprefix("0x").rjust(16, "0")


# --- ibnetdiscover -p ---------------------------------------------------------------------------

_END = r"(?P<{p}type>CA|SW|RT)\s+(?P<{p}lid>\d{{1,20}})\s+(?P<{p}port>\d{{1,20}})\s+(?P<{p}guid>0x[0-9a-fA-F]+)"
_PORTS_LINE = re.compile(
    _END.format(p="l") + r"\s+(?P<width>\S+)\s+(?P<speed>\S+)"
    r"(?:\s+-\s+" + _END.format(p="r") + r"\s+\(\s*'(?P<ldesc>.*?)'\s+-\s+'(?P<rdesc>.*)'\s*\)"
    r"|\s+'(?P<odesc>.*)'|\s+(?P<bare>\S.*?))?\s*"
)


def _ports_line(m: re.Match[str]) -> IbnetPort:
    desc = m["ldesc"] if m["ldesc"] is not None else (m["odesc"] or m["bare"] or "")
    local = IbnetEnd(m["ltype"], int(m["llid"]), int(m["lport"]), guid64(m["lguid"]), desc.strip())
    remote = None
    if m["rtype"]:
        remote = IbnetEnd(m["rtype"], int(m["rlid"]), int(m["rport"]), guid64(m["rguid"]), m["rdesc"].strip())
    return IbnetPort(local, m["width"], m["speed"], remote)


# --- the topology file --------------------------------------------------------------------------

_TYPES = {"S": "SW", "H": "CA", "R": "RT"}
_HEX = "[0-9a-fA-F]"
_NODE = re.compile(
    r"(?P<kind>Switch|Ca|Rt)\s+(?P<nports>\d{1,20})\s+\"(?P<letter>[SHR])-(?P<guid>"
    + _HEX
    + r"+)\"\s*#\s*\"(?P<desc>.*)\""
    r"(?:\s+(?:base|enhanced)\s+port\s+0\s+lid\s+(?P<lid>\d{1,20})\s+lmc\s+\d{1,20})?(?:\s+\(scp\))?\s*"
)
_SWITCHGUID = re.compile(r"switchguid=0x(?P<node>" + _HEX + r"+)\((?P<port>" + _HEX + r"+)\).*")
_HEADER = re.compile(
    r"(?:vendid|devid|sysimgguid|caguid|rtguid|switchguid)=0x" + _HEX + r"+.*|Chassis \d{1,20}.*|Non-Chassis Nodes"
)
_EXT = r"(?:\[ext \d{1,20}\])?"
# The far end, then a comment whose tail is always `"<far desc>" lid <far lid> <width><speed>` plus the
# optional -f and Xsigo suffixes; the greedy description backtracks to the last `" lid N` on the line.
_FAR = (
    r"\"(?P<rletter>[SHR?])-(?P<rguid>"
    + _HEX
    + r"+)\"\[(?P<rport>\d{1,20})\]"
    + _EXT
    + r"(?:\s*\((?P<rpguid>"
    + _HEX
    + r"+)\))?"
)
_TAIL = (
    r"\"(?P<rdesc>.*)\"\s+lid\s+(?P<rlid>\d{1,20})\s+(?P<width>\d{1,20}x|\?\?)(?P<speed>\S+)"
    r"(?:\s+s=\d{1,20}\s+w=\d{1,20}\s+v=\d{1,20})?(?:\s+slot\s+\d{1,20}|\s+\(scp\))?\s*"
)
_SWITCH_PORT = re.compile(r"\[(?P<port>\d{1,20})\]" + _EXT + r"\s+" + _FAR + r"\s*#\s*" + _TAIL)
_CA_PORT = re.compile(
    r"\[(?P<port>\d{1,20})\]\((?P<pguid>"
    + _HEX
    + r"+)\)\s*"
    + _FAR
    + r"\s*#\s*lid\s+(?P<llid>\d{1,20})\s+lmc\s+\d{1,20}\s+"
    + _TAIL
)


@dataclass(slots=True)
class _Node:
    type: str
    guid: str  # node GUID
    desc: str
    lid: int


def parse_ibnetdiscover(text: str) -> IbnetDiscovery:
    """Port lines of either format; every other non-comment line that is not part of a node block is
    a problem (a tool warning, a truncated line), and so is an input with no port at all."""
    out = IbnetDiscovery()
    switch_port_guids: dict[str, str] = {}  # node GUID -> port GUID, from switchguid= lines
    pending: list[tuple[_Node, re.Match[str], bool]] = []  # topology port lines, resolved at the end
    node: _Node | None = None
    pending_switchguid: tuple[str, str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if m := _PORTS_LINE.fullmatch(stripped):
            out.ports.append(_ports_line(m))
            _seen(out, "ports")
        elif m := _SWITCHGUID.fullmatch(stripped):
            pending_switchguid = (guid64(m["node"]), guid64(m["port"]))
        elif _HEADER.fullmatch(stripped):
            continue
        elif m := _NODE.fullmatch(stripped):
            node = _Node(_TYPES[m["letter"]], guid64(m["guid"]), m["desc"].strip(), int(m["lid"] or 0))
            if node.type == "SW" and pending_switchguid and pending_switchguid[0] == node.guid:
                switch_port_guids[node.guid] = pending_switchguid[1]
            pending_switchguid = None
            _seen(out, "topology")
        elif node is not None and (m := (_CA_PORT if node.type != "SW" else _SWITCH_PORT).fullmatch(stripped)):
            pending.append((node, m, node.type != "SW"))
        elif tool_message(stripped):
            out.problems.append(problem(number, "tool diagnostic (the discovery may be incomplete)", stripped))
        elif not command_line(stripped, "ibnetdiscover"):
            out.problems.append(problem(number, "not an ibnetdiscover port, node or header line", stripped))
    out.ports.extend(_topology_port(n, m, ca, switch_port_guids) for n, m, ca in pending)
    if not out.ports:
        out.problems.append(problem(0, "no ibnetdiscover port lines (neither -p nor topology format)"))
    return out


def _seen(out: IbnetDiscovery, fmt: str) -> None:
    if fmt not in out.formats:
        out.formats.append(fmt)


def _topology_port(node: _Node, m: re.Match[str], ca: bool, switch_port_guids: dict[str, str]) -> IbnetPort:
    local_guid = guid64(m["pguid"]) if ca else switch_port_guids.get(node.guid, node.guid)
    local_lid = int(m["llid"]) if ca else node.lid
    local = IbnetEnd(node.type, local_lid, int(m["port"]), local_guid, node.desc)
    rtype = _TYPES.get(m["rletter"], "??")
    rnode = guid64(m["rguid"])
    rguid = guid64(m["rpguid"]) if m["rpguid"] else switch_port_guids.get(rnode, rnode)
    remote = IbnetEnd(rtype, int(m["rlid"]), int(m["rport"]), rguid, m["rdesc"].strip())
    return IbnetPort(local, m["width"], m["speed"], remote)
