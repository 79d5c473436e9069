"""``ibqueryerrors`` output: every port of the fabric whose error counters pass their threshold, in
one run (rdma-core ``infiniband-diags/ibqueryerrors.c``, ``print_results`` / ``print_data_cnts`` /
``print_port_config`` / ``print_summary``)::

    Errors for 0x2c903006e29b0 "MF0;ys23ib4:SX6036/U1"          (a switch; a CA has no GUID here)
       GUID 0x2c903006e29b0 port 5: [SymbolErrorCounter == 65535] [PortXmitWait == 84704351]
           Link info:     12    5[  ] ==( 4X ... Active/  LinkUp)==>  0x... 7 1[  ] "node mlx5_0" ( )
    ## Summary: 4 nodes checked, 4 bad nodes found
    ## Suppressed: SymbolErrorCounter

- A value printed bare (``[Name == 65535]``) is the narrow, saturating PortCounters field; one with a
  human-readable suffix (``[PortXmitWait == 123 (123.000 )]``) is the 64-bit PortCountersExtended one
  (``check_threshold``: the port has IsAdditionalPortCountersExtendedSupported).
- ``--details`` adds the PortRcvErrorDetails / PortXmitDiscardDetails fields to the same list,
  ``--data`` (and ``--counters``: ``Data Counters for ...``) the data counters, ``-r`` the ``Link info``
  line; ``-s``/``-c`` suppress fields and the summary names them (``## Suppressed:``, or
  ``Suppressing:`` in older releases).
- ``port ALL`` is a switch's sum over its ports (``portnum == 0xFF``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fabricd.drivers.ib.perfquery import DETAILS, PERFQUERY_X, PerfSpec, narrow_spec
from fabricd.parsers.common import Problem, command_line, problem, tool_message
from fabricd.parsers.ibnetdiscover import guid64
from fabricd.parsers.perfquery import PortCounters, add_counter


@dataclass(frozen=True, slots=True)
class PortField:
    raw: str
    value: int  # as printed (data counters in 4-octet words)
    spec: PerfSpec | None


@dataclass(slots=True)
class Summary:
    nodes_checked: int | None = None
    bad_nodes: int | None = None
    ports_checked: int | None = None
    bad_ports: int | None = None
    pma_query_failures: int = 0
    thresholds: dict[str, int] = field(default_factory=dict)
    suppressed: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class IbqueryerrorsResult:
    ports: list[PortCounters]
    fields: dict[int, list[PortField]]  # index into ports -> the fields as printed (for readings)
    summary: Summary
    problems: list[Problem]


_HEX = "0x[0-9a-fA-F]+"
_NODE = re.compile(r"(?:Errors|Data Counters) for (?:(?P<guid>" + _HEX + r") )?\"(?P<name>.*)\"")
_PORT = re.compile(r"GUID (?P<guid>" + _HEX + r") port (?P<port>\d{1,20}|ALL):(?P<items>.*)")
_ITEM = re.compile(r"\[(?P<name>\w+) == (?P<value>\d{1,20})(?P<human> \([^)]*\))?\]")
_LINK = re.compile(r"Link info:\s+(?P<lid>\d{1,20})\s+(?P<port>\d{1,20})\[.*")
_SUMMARY_NODES = re.compile(r"## Summary: (\d{1,20}) nodes checked, (\d{1,20}) bad nodes found")
_SUMMARY_PORTS = re.compile(r"##\s+(\d{1,20}) ports checked, (\d{1,20}) ports have errors beyond threshold")
_PMA_FAILURES = re.compile(r"##\s+(\d{1,20}) PMA query failures")
_THRESHOLD = re.compile(r"\[(\w+) = (\d{1,20})\]")
_SUPPRESSED = re.compile(r"(?:## Suppressed:|Suppressing:)(?P<names>.*)")


def _spec(raw: str, wide: bool) -> PerfSpec | None:
    if raw in DETAILS:
        return DETAILS[raw]
    if wide or raw not in PERFQUERY_X:
        return PERFQUERY_X.get(raw)
    return narrow_spec(raw) or PERFQUERY_X[raw]  # a bare value is the narrow PortCounters field


@dataclass(slots=True)
class _State:
    name: str | None = None
    ports: list[PortCounters] = field(default_factory=list)
    fields: dict[int, list[PortField]] = field(default_factory=dict)
    summary: Summary = field(default_factory=Summary)
    problems: list[Problem] = field(default_factory=list)


def parse_ibqueryerrors(text: str) -> IbqueryerrorsResult:
    """Every port record in text order; a port listed twice (errors, then data counters) is one record.
    No port at all is not a problem when the summary is there: a clean fabric lists none."""
    state = _State()
    seen_summary = False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        if m := _NODE.fullmatch(stripped):
            state.name = m["name"]
        elif m := _PORT.fullmatch(stripped):
            _port_line(state, m, number, stripped)
        elif m := _LINK.fullmatch(stripped):
            _link_line(state, m)
        elif command_line(stripped, "ibqueryerrors"):
            continue
        elif stripped.startswith(("##", "Suppressing:")):
            seen_summary = _summary_line(state.summary, stripped) or seen_summary
        elif tool_message(stripped):
            state.problems.append(problem(number, "tool diagnostic (a PMA query failed)", stripped))
        else:
            state.problems.append(problem(number, "not an ibqueryerrors node, port, link or summary line", stripped))
    if not state.ports and not seen_summary:
        state.problems.append(problem(0, "no ibqueryerrors port lines and no summary"))
    return IbqueryerrorsResult(state.ports, state.fields, state.summary, state.problems)


def _record(state: _State, guid: str, port: int | str) -> tuple[int, PortCounters]:
    for i, existing in enumerate(state.ports):
        if existing.guid == guid and existing.port == port:
            return i, existing
    state.ports.append(PortCounters(guid, port, None, state.name))
    return len(state.ports) - 1, state.ports[-1]


def _port_line(state: _State, m: re.Match[str], number: int, stripped: str) -> None:
    items = list(_ITEM.finditer(m["items"]))
    if _ITEM.sub("", m["items"]).strip():
        state.problems.append(problem(number, "unreadable counter list (truncated line?)", stripped))
    port: int | str = "ALL" if m["port"] == "ALL" else int(m["port"])
    index, record = _record(state, guid64(m["guid"]), port)
    fields = state.fields.setdefault(index, [])
    for item in items:
        raw, value = item["name"], int(item["value"])
        spec = _spec(raw, item["human"] is not None)
        fields.append(PortField(raw, value, spec))
        add_counter(record, raw, value, spec)


def _link_line(state: _State, m: re.Match[str]) -> None:
    """``-r``: the port's LID (a switch's is its port 0 LID) for the record just printed."""
    if state.ports and state.ports[-1].port == int(m["port"]):
        last = state.ports[-1]
        state.ports[-1] = PortCounters(last.guid, last.port, int(m["lid"]), last.name, last.counters, last.saturated)


def _summary_line(summary: Summary, stripped: str) -> bool:
    if m := _SUMMARY_NODES.fullmatch(stripped):
        summary.nodes_checked, summary.bad_nodes = int(m[1]), int(m[2])
        return True
    if m := _SUMMARY_PORTS.fullmatch(stripped):
        summary.ports_checked, summary.bad_ports = int(m[1]), int(m[2])
    elif m := _PMA_FAILURES.fullmatch(stripped):
        summary.pma_query_failures = int(m[1])
    elif stripped.startswith("## Thresholds:"):
        summary.thresholds = {name: int(v) for name, v in _THRESHOLD.findall(stripped)}
    elif m := _SUPPRESSED.fullmatch(stripped):
        summary.suppressed = m["names"].replace(",", " ").split()
    return False
