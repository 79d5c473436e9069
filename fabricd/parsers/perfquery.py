"""``perfquery -x`` / ``-E`` output: one block per ``# Port ... counters: Lid L port P`` header, then
``Name:.....value`` lines (rdma-core ``infiniband-diags/perfquery.c``). Field semantics (neutral
name, width, whether it saturates) come from ``fabricd.drivers.ib.perfquery``.

``ports(blocks)`` turns the blocks into the ``PortCounters`` records ``fabricd parse perfquery`` and
``ibqueryerrors`` share: values in base units (data words x 4 = bytes) and the saturated fields named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fabricd.drivers.ib.perfquery import (
    IS_ADDL_PORT_CTR_EXT_SUP,
    LEGACY_NAMES,
    NOT_COUNTERS,
    PERFQUERY_E,
    PERFQUERY_X,
    PerfSpec,
    ceiling,
    narrow_spec,
)
from fabricd.parsers.common import Problem, command_line, problem, tool_message


@dataclass(frozen=True, slots=True)
class PerfBlock:
    """One ``# Port ... counters: Lid L port P`` block of perfquery output."""

    attribute: str  # "basic" (perfquery), "extended" (perfquery -x) or "rcv_error_details" (perfquery -E)
    lid: int
    port: int
    cap_mask2: int | None = None  # from the header; None when perfquery did not print it
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def wide_errors(self) -> bool:
        return self.cap_mask2 is not None and bool(self.cap_mask2 & IS_ADDL_PORT_CTR_EXT_SUP)


@dataclass(frozen=True, slots=True)
class PortCounters:
    """One port's counters by neutral name (an unknown field keeps its raw name), in base units."""

    guid: str | None
    port: int | str | None  # "ALL": ibqueryerrors' sum over a switch's ports
    lid: int | None
    name: str | None  # node description, when the text gives one
    counters: dict[str, int] = field(default_factory=dict)
    saturated: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PerfqueryResult:
    blocks: list[PerfBlock]
    problems: list[Problem]


_PERF_HEADER = re.compile(r"#\s*(?P<what>.+?) counters:\s*Lid\s+(?P<lid>\d{1,20})\s+port\s+(?P<port>\d{1,20})\b.*")
_CAP_MASK2 = re.compile(r"CapMask2:\s*(0x[0-9a-fA-F]+)")
_PERF_LINE = re.compile(r"(?P<name>\w+):\.*(?P<value>0x[0-9a-fA-F]+|\d{1,20})\s*")


def _attribute(header: str) -> str:
    """``# Port counters:`` is plain perfquery (PortCounters), ``# Port extended counters:`` is -x."""
    if "RcvErrorDetails" in header:
        return "rcv_error_details"
    return "basic" if header.strip() == "Port" else "extended"


def parse_perfquery(text: str) -> list[PerfBlock]:
    """The blocks only (what the ``ibfabric`` collector needs); empty output is no blocks."""
    return parse_perfquery_text(text).blocks


def parse_perfquery_text(text: str) -> PerfqueryResult:
    """Blocks and problems: a field line before any header, an unreadable line, or no block at all."""
    blocks: list[PerfBlock] = []
    problems: list[Problem] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        if header := _PERF_HEADER.fullmatch(stripped):
            mask2 = _CAP_MASK2.search(stripped)
            cap = int(mask2.group(1), 16) if mask2 else None
            blocks.append(PerfBlock(_attribute(header["what"]), int(header["lid"]), int(header["port"]), cap))
        elif (m := _PERF_LINE.fullmatch(stripped)) and blocks:
            if m["name"] not in NOT_COUNTERS:
                blocks[-1].counters[m["name"]] = int(m["value"], 0)
        elif tool_message(stripped):
            problems.append(problem(number, "tool diagnostic (the query failed or is incomplete)", stripped))
        elif not stripped.startswith("#") and not command_line(stripped, "perfquery"):
            problems.append(problem(number, "not a perfquery header or Name:....value line", stripped))
    if not blocks:
        problems.append(problem(0, "no perfquery counter block (# Port counters: Lid L port P)"))
    return PerfqueryResult(blocks, problems)


def counter_spec(block: PerfBlock, raw: str, value: int) -> PerfSpec | None:
    """Semantics of one perfquery field in this block (None: unknown, never guess a width)."""
    if block.attribute == "rcv_error_details":
        return PERFQUERY_E.get(raw)
    spec = PERFQUERY_X.get(LEGACY_NAMES.get(raw, raw))
    narrow = narrow_spec(raw, basic=block.attribute == "basic")
    if spec is None or narrow is None or block.wide_errors or value >> narrow.width:
        return spec  # a value above all ones proves the field is the 64-bit one
    return narrow


def add_counter(out: PortCounters, raw: str, value: int, spec: PerfSpec | None) -> None:
    """One field into a port record: scaled to base units, named, and flagged when saturated."""
    name = spec.name if spec else raw
    out.counters[name] = value * (spec.scale if spec else 1)
    if spec is not None and spec.saturates and value >= ceiling(spec.width) and name not in out.saturated:
        out.saturated.append(name)


def ports(blocks: list[PerfBlock], guid: str | None = None) -> list[PortCounters]:
    """One record per (lid, port), ``-x`` and ``-E`` blocks of the same port merged, in text order."""
    found: dict[tuple[int, int], PortCounters] = {}
    for block in blocks:
        key = (block.lid, block.port)
        record = found.setdefault(key, PortCounters(guid, block.port, block.lid, None))
        for raw, value in block.counters.items():
            add_counter(record, raw, value, counter_spec(block, raw, value))
    return list(found.values())
