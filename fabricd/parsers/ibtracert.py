"""``ibtracert`` output: the path a LID-routed packet takes from one port to another.

ibtracert (infiniband-diags) walks the switches' linear forwarding tables (LFTs) from the source
port to the destination LID and prints one line per hop (rdma-core ``infiniband-diags/ibtracert.c``,
``dump_endnode`` and ``dump_route``)::

    From ca {0x0000000000100000} portnum 1 lid 2-2 "gpu-a01 mlx5_0"
    [1] -> switch port {0x0000000000200000}[1] lid 1-1 "ib-leaf-1"
    [8] -> switch port {0x0000000000200003}[1] lid 6-6 "ib-spine-2"
    [2] -> switch port {0x0000000000200001}[8] lid 3-3 "ib-leaf-2"
    [2] -> ca port {0x0000000000100007}[1] lid 8-8 "gpu-b02 mlx5_0"
    To ca {0x0000000000100006} portnum 1 lid 8-8 "gpu-b02 mlx5_0"

- ``From``/``To``: the end's node type, its **node** GUID, its port (0 for a switch), its LID range
  (``lid`` to ``lid + 2^lmc - 1``) and node description;
- each hop: ``[out]`` the port the packet leaves the previous node by, then the next node's type,
  **port** GUID, the port it enters by, LID range and description.

``-n`` prints the same path without types, LIDs or descriptions (``From {guid}[port]``,
``[out] -> {guid}[port]``, ``To {guid}[port]``). A trace that fails prints ``ibwarn:`` lines and
``ibtracert: iberror: failed: ...`` on stderr (exit status 255): they become ``problems``, and a
path without its ``To`` line is not ``complete``. The path is the static one (the LFTs); with
adaptive routing on, a switch may send a packet out of any port of the destination's AR group
instead (docs/topology.md, "InfiniBand").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fabricd.parsers.common import Problem, command_line, problem, tool_message
from fabricd.parsers.ibnetdiscover import guid64

TYPES = {"ca": "CA", "switch": "SW", "router": "RT"}  # ibtracert.c node_type_str -> ibnetdiscover's


@dataclass(frozen=True, slots=True)
class TraceEnd:
    """The source or destination: node GUID, port (0: a switch), LIDs (0: ``-n`` output)."""

    type: str  # "CA", "SW", "RT"; "" in -n output
    guid: str  # node GUID
    port: int
    lid: int = 0
    lid_last: int = 0
    desc: str = ""


@dataclass(frozen=True, slots=True)
class TraceHop:
    """One hop: out of the previous node's port ``out_port``, into ``port`` of the node whose
    port GUID is ``guid``."""

    out_port: int
    type: str  # "" in -n output
    guid: str  # port GUID (a switch's is its port 0's)
    port: int
    lid: int = 0
    lid_last: int = 0
    desc: str = ""


@dataclass(slots=True)
class Trace:
    source: TraceEnd | None = None
    hops: list[TraceHop] = field(default_factory=list)
    destination: TraceEnd | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """The destination was reached (ibtracert printed its ``To`` line)."""
        return self.source is not None and self.destination is not None


_GUID = r"\{(?P<guid>0x[0-9a-fA-F]{1,16})\}"
_LIDS = r"lid (?P<lid>\d{1,5})-(?P<last>\d{1,5})"
_DESC = r'"(?P<desc>.*)"'
_TYPE = r"(?P<type>ca|switch|router|iwarp rnic|\?\?\?)"
_END = re.compile(rf"(?P<which>From|To) {_TYPE} {_GUID} portnum (?P<port>\d{{1,3}}) {_LIDS} {_DESC}")
_HOP = re.compile(rf"\[(?P<out>\d{{1,3}})\] -> {_TYPE} port {_GUID}\[(?P<port>\d{{1,3}})\] {_LIDS} {_DESC}")
_SIMPLE_END = re.compile(rf"(?P<which>From|To) {_GUID}\[(?P<port>\d{{1,3}})\]")
_SIMPLE_HOP = re.compile(rf"\[(?P<out>\d{{1,3}})\] -> {_GUID}\[(?P<port>\d{{1,3}})\]")


def _kind(m: re.Match[str]) -> str:
    return TYPES.get(m["type"], m["type"]) if "type" in m.groupdict() else ""


def _lids(m: re.Match[str]) -> tuple[int, int, str]:
    if "lid" not in m.groupdict():
        return 0, 0, ""
    return int(m["lid"]), int(m["last"]), m["desc"].strip()


def _end(m: re.Match[str]) -> TraceEnd:
    return TraceEnd(_kind(m), guid64(m["guid"]), int(m["port"]), *_lids(m))


def _hop(m: re.Match[str]) -> TraceHop:
    return TraceHop(int(m["out"]), _kind(m), guid64(m["guid"]), int(m["port"]), *_lids(m))


def parse_ibtracert(text: str) -> Trace:
    """The path in ``ibtracert`` (or ``ibtracert -n``) output, stdout alone or with stderr."""
    out = Trace()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        end = _END.fullmatch(line) or _SIMPLE_END.fullmatch(line)
        hop = None if end else _HOP.fullmatch(line) or _SIMPLE_HOP.fullmatch(line)
        if end is not None and end["which"] == "From" and out.source is None:
            out.source = _end(end)
        elif end is not None and end["which"] == "To" and out.source is not None and out.destination is None:
            out.destination = _end(end)
        elif hop is not None and out.source is not None and out.destination is None:
            out.hops.append(_hop(hop))
        elif tool_message(line) or line.startswith("ibtracert:"):
            out.problems.append(problem(number, _message(line), line))
        elif not command_line(line, "ibtracert"):
            out.problems.append(problem(number, "not an ibtracert line (or out of place)", line))
    if out.source is None and not out.problems:
        out.problems.append(problem(0, "no ibtracert path (no From line)"))
    return out


_PID = re.compile(r"^ibwarn: \[\d+\] ")


def _message(line: str) -> str:
    """A tool diagnostic without its process id (``ibwarn: [25419] find_route: ...``)."""
    return _PID.sub("ibwarn: ", line)
