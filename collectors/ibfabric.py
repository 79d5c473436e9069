"""InfiniBand switch port counters for a whole fabric, from one management node.

Topology comes from ``ibnetdiscover -p``; counters from ``perfquery -x`` (PortCountersExtended)
per switch and, optionally, ``perfquery -E`` (PortRcvErrorDetails) per cabled switch port. Every
switch port reading carries the far end of its cable (``remote``, ``remote_port``,
``remote_type``), which is what a user needs to walk to the right cable.

The tools run through ``fabricd.command.CommandRunner`` (one async method with a timeout; tests
swap it through ``IbFabricFactories``), with at most ``concurrency`` commands at once. The commands are settings, with
``{guid}`` and ``{port}`` placeholders. Parsing is pure: ``parse_perfquery``, ``parse_ibstat``,
``parse_ibstatus`` and ``fabricd.topology.parse_ibnetdiscover``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import Field, field_validator

from fabricd.collector import CollectorContext, CollectorFactories, CollectorOptions
from fabricd.command import CommandResult, CommandRunner, SubprocessRunner
from fabricd.model import Kind, Labels, Reading, labels_of
from fabricd.topology import IbnetEnd, IbnetPort, end_id, parse_ibnetdiscover, switch_ids

log = logging.getLogger(__name__)

SOURCE = "ibfabric"
WORD_BYTES = 4  # PortXmitData/PortRcvData count 4-octet words (IBA 16.1.4.11; DOMAIN.md)
GBIT_BYTES_PER_SECOND = 125_000_000
MAX_LABEL_CHARS = 128


# ---------------------------------------------------------------------------------------------
# Counter semantics
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PerfSpec:
    name: str
    unit: str = ""
    width: int = 64
    saturates: bool = False
    scale: int = 1


# perfquery -x prints PortCountersExtended. On ports whose CapabilityMask2 has
# IsAdditionalPortCountersExtendedSupported it also prints the error counters after CounterSelect2,
# and those are the 64-bit fields of the extended attribute (IBA 1.3 16.1.4.11), not the narrow
# saturating PortCounters ones. Neutral names match the infiniband (sysfs) collector.
PERFQUERY_X: dict[str, PerfSpec] = {
    "PortXmitData": PerfSpec("port_transmit_data", "bytes", scale=WORD_BYTES),
    "PortRcvData": PerfSpec("port_receive_data", "bytes", scale=WORD_BYTES),
    "PortXmitPkts": PerfSpec("port_transmit_packets", "packets"),
    "PortRcvPkts": PerfSpec("port_receive_packets", "packets"),
    "PortUnicastXmitPkts": PerfSpec("unicast_transmit_packets", "packets"),
    "PortUnicastRcvPkts": PerfSpec("unicast_receive_packets", "packets"),
    "PortMulticastXmitPkts": PerfSpec("multicast_transmit_packets", "packets"),
    "PortMulticastRcvPkts": PerfSpec("multicast_receive_packets", "packets"),
    "SymbolErrorCounter": PerfSpec("symbol_errors"),
    "LinkErrorRecoveryCounter": PerfSpec("link_error_recovery"),
    "LinkDownedCounter": PerfSpec("link_downed"),
    "PortRcvErrors": PerfSpec("port_receive_errors"),
    "PortRcvRemotePhysicalErrors": PerfSpec("port_receive_remote_physical_errors"),
    "PortRcvSwitchRelayErrors": PerfSpec("port_receive_switch_relay_errors"),
    "PortXmitDiscards": PerfSpec("port_transmit_discards"),
    "PortXmitConstraintErrors": PerfSpec("port_transmit_constraint_errors"),
    "PortRcvConstraintErrors": PerfSpec("port_receive_constraint_errors"),
    "LocalLinkIntegrityErrors": PerfSpec("local_link_integrity_errors"),
    "ExcessiveBufferOverrunErrors": PerfSpec("excessive_buffer_overrun_errors"),
    "VL15Dropped": PerfSpec("vl15_dropped"),
    # Ticks with data to send and no credit: the IB congestion signal (DOMAIN.md).
    "PortXmitWait": PerfSpec("port_transmit_wait", "ticks"),
    "QP1Dropped": PerfSpec("qp1_dropped"),
}
# PortRcvErrorDetails (perfquery -E): 16-bit PMA counters, which stop at all ones (IBA 16.1.4.3).
PERFQUERY_E: dict[str, PerfSpec] = {
    raw: PerfSpec(name, "", 16, True)
    for raw, name in {
        "PortLocalPhysicalErrors": "port_local_physical_errors",
        "PortMalformedPktErrors": "port_malformed_packet_errors",
        "PortBufferOverrunErrors": "port_buffer_overrun_errors",
        "PortDLIDMappingErrors": "port_dlid_mapping_errors",
        "PortVLMappingErrors": "port_vl_mapping_errors",
        "PortLoopingErrors": "port_looping_errors",
    }.items()
}
# Without IsAdditionalPortCountersExtendedSupported (CapabilityMask2 bit 1) the extended attribute
# has no error counters and perfquery fills them from the base PortCounters, whose fields are narrow
# and stop at all ones (IBA 16.1.3.5; widths as in DOMAIN.md).
IS_ADDL_PORT_CTR_EXT_SUP = 0x2
PORT_COUNTERS_WIDTHS: dict[str, int] = {
    "SymbolErrorCounter": 16,
    "LinkErrorRecoveryCounter": 8,
    "LinkDownedCounter": 8,
    "PortRcvErrors": 16,
    "PortRcvRemotePhysicalErrors": 16,
    "PortRcvSwitchRelayErrors": 16,
    "PortXmitDiscards": 16,
    "PortXmitConstraintErrors": 8,
    "PortRcvConstraintErrors": 8,
    "LocalLinkIntegrityErrors": 4,
    "ExcessiveBufferOverrunErrors": 4,
    "VL15Dropped": 16,
    "QP1Dropped": 16,
    "PortXmitWait": 32,
}
_NOT_COUNTERS = frozenset({"PortSelect", "CounterSelect", "CounterSelect2"})

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


# ---------------------------------------------------------------------------------------------
# Pure parsers
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PerfBlock:
    """One ``# Port ... counters: Lid L port P`` block of perfquery output."""

    attribute: str  # "extended" (perfquery -x) or "rcv_error_details" (perfquery -E)
    lid: int
    port: int
    cap_mask2: int | None = None  # from the header; None when perfquery did not print it
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def wide_errors(self) -> bool:
        return self.cap_mask2 is not None and bool(self.cap_mask2 & IS_ADDL_PORT_CTR_EXT_SUP)


_PERF_HEADER = re.compile(r"#\s*(?P<what>.+?) counters:\s*Lid\s+(?P<lid>\d+)\s+port\s+(?P<port>\d+)\b.*")
_CAP_MASK2 = re.compile(r"CapMask2:\s*(0x[0-9a-fA-F]+)")
_PERF_LINE = re.compile(r"(?P<name>\w+):\.*(?P<value>0x[0-9a-fA-F]+|\d+)\s*")


def _attribute(header: str) -> str:
    return "rcv_error_details" if "RcvErrorDetails" in header else "extended"


def parse_perfquery(text: str) -> list[PerfBlock]:
    """``perfquery -x`` / ``-E`` output, one block per port; ``Name:.....value`` lines. Empty output
    (a node that did not answer) is no blocks. Select fields (``PortSelect``...) are dropped."""
    blocks: list[PerfBlock] = []
    for line in text.splitlines():
        header = _PERF_HEADER.fullmatch(line.strip())
        if header:
            mask2 = _CAP_MASK2.search(line)
            blocks.append(
                PerfBlock(
                    _attribute(header["what"]),
                    int(header["lid"]),
                    int(header["port"]),
                    int(mask2.group(1), 16) if mask2 else None,
                )
            )
            continue
        m = _PERF_LINE.fullmatch(line.strip())
        if m and blocks and m["name"] not in _NOT_COUNTERS:
            blocks[-1].counters[m["name"]] = int(m["value"], 0)
    return blocks


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
_IBSTAT_PORT = re.compile(r"Port (?P<port>\d+):")


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
        float(rate) if re.fullmatch(r"\d+(\.\d+)?", rate) else None,
        f.get("link layer", ""),
        int(f["base lid"]) if f.get("base lid", "").isdigit() else None,
        f.get("port guid", ""),
    )


_IBSTATUS_HEAD = re.compile(r"Infiniband device '(?P<dev>[^']*)' port (?P<port>\d+) status:")
_ID_NAME = re.compile(r"(?P<id>\d+):\s*(?P<name>\S+)")


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
    rate = re.match(r"(\d+(?:\.\d+)?)\s*Gb/sec", f.get("rate", ""))
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
        int(lid, 0) if lid else None,
        "",
    )


# ---------------------------------------------------------------------------------------------
# Mapping to readings (pure)
# ---------------------------------------------------------------------------------------------


def _bounded(value: str) -> str:
    return value[:MAX_LABEL_CHARS]


def remote_labels(port: IbnetPort | None, switches: dict[str, str]) -> dict[str, str]:
    """Labels naming the far end of a switch port's cable (empty when not cabled)."""
    if port is None or port.remote is None:
        return {}
    far: IbnetEnd = port.remote
    return {"remote": _bounded(end_id(far, switches)), "remote_port": str(far.port), "remote_type": far.type}


def counter_spec(block: PerfBlock, raw: str, value: int) -> PerfSpec | None:
    """Semantics of one perfquery field in this block (None: unknown, never guess a width)."""
    if block.attribute == "rcv_error_details":
        return PERFQUERY_E.get(raw)
    spec = PERFQUERY_X.get(raw)
    narrow = PORT_COUNTERS_WIDTHS.get(raw)
    if spec is None or narrow is None or block.wide_errors or value >> narrow:
        return spec  # a value above all ones proves the field is the 64-bit one
    return PerfSpec(spec.name, spec.unit, narrow, True, spec.scale)


def block_readings(device: str, block: PerfBlock, labels: Labels) -> list[Reading]:
    out = []
    for raw, value in block.counters.items():
        spec = counter_spec(block, raw, value)
        if spec is None:
            continue
        out.append(
            Reading(
                SOURCE,
                device,
                str(block.port),
                raw,
                float(value * spec.scale),
                spec.unit,
                Kind.COUNTER,
                labels,
                spec.name,
                spec.width,
                spec.saturates,
                float(spec.scale),
            )
        )
    return out


def status_readings(p: IbPortStatus) -> list[Reading]:
    """Port state / physical state / rate gauges of the management node's own HCAs (ibstat)."""
    out = []
    values = (
        ("state", p.state_id, "", "port_state"),
        ("phys_state", p.phys_state_id, "", "port_physical_state"),
        ("rate", None if p.rate_gbps is None else p.rate_gbps * GBIT_BYTES_PER_SECOND, "bytes_per_second", "link_rate"),
    )
    for counter, value, unit, name in values:
        if value is not None:
            out.append(Reading(SOURCE, p.device, str(p.port), counter, float(value), unit, Kind.GAUGE, (), name, 0))
    return out


# ---------------------------------------------------------------------------------------------
# The collector
# ---------------------------------------------------------------------------------------------


class IbFabricOptions(CollectorOptions):
    ibnetdiscover_command: list[str] = Field(default=["ibnetdiscover", "-p"], min_length=1)
    # -l loops over every port of the node, one block each.
    perfquery_command: list[str] = Field(default=["perfquery", "-x", "-l", "-G", "{guid}"], min_length=1)
    # PortRcvErrorDetails per cabled switch port; None disables (one command per port is costly).
    perfquery_errors_command: list[str] | None = ["perfquery", "-E", "-G", "{guid}", "{port}"]
    ibstat_command: list[str] | None = None  # the management node's own HCAs (ibstat)
    include_hcas: bool = False  # also query CA ports (HCAs); switches only by default
    concurrency: int = Field(default=8, ge=1, le=256)
    timeout_seconds: float = Field(default=10.0, gt=0)
    rediscover_every: int = Field(default=60, ge=1)  # scrapes between ibnetdiscover runs

    @field_validator("perfquery_command", "perfquery_errors_command")
    @classmethod
    def _needs_guid(cls, argv: list[str] | None) -> list[str] | None:
        if argv is not None and not any("{guid}" in word for word in argv):
            raise ValueError("the command must contain a {guid} placeholder")
        return argv


@dataclass(frozen=True, slots=True)
class IbFabricFactories(CollectorFactories):
    runner: Callable[[], CommandRunner] = SubprocessRunner


@dataclass(frozen=True, slots=True)
class FabricTarget:
    """One node to query: its guid, element id, and each of its ports' ibnetdiscover line."""

    guid: str
    device: str
    ports: dict[int, IbnetPort]


def fabric_targets(ports: Sequence[IbnetPort], include_hcas: bool) -> list[FabricTarget]:
    switches = switch_ids(ports)
    by_guid: dict[str, dict[int, IbnetPort]] = {}
    devices: dict[str, str] = {}
    for p in ports:
        if p.local.type == "SW" or include_hcas:
            by_guid.setdefault(p.local.guid, {})[p.local.port] = p
            devices[p.local.guid] = end_id(p.local, switches)
    return [FabricTarget(g, devices[g], by_guid[g]) for g in sorted(by_guid)]


class IbFabricCollector:
    name: ClassVar[str] = "ibfabric"
    Options = IbFabricOptions

    def __init__(self, ctx: CollectorContext) -> None:
        assert isinstance(ctx.options, IbFabricOptions)
        self._opts = ctx.options
        self._runner = ctx.factories_for(IbFabricFactories).runner()
        self._semaphore = asyncio.Semaphore(self._opts.concurrency)
        self._ports: list[IbnetPort] = []
        self._scrapes = 0
        self._logged: set[str] = set()

    async def collect(self) -> Sequence[Reading]:
        await self._refresh_topology()
        switches = switch_ids(self._ports)
        targets = fabric_targets(self._ports, self._opts.include_hcas)
        jobs = [self._target_readings(t, switches) for t in targets]
        if self._opts.ibstat_command:
            jobs.append(self._ibstat_readings(self._opts.ibstat_command))
        return [r for batch in await asyncio.gather(*jobs) for r in batch]

    async def _refresh_topology(self) -> None:
        self._scrapes += 1
        if self._ports and (self._scrapes - 1) % self._opts.rediscover_every:
            return
        result = await self._run(self._opts.ibnetdiscover_command)
        ports = parse_ibnetdiscover(result.output) if result.returncode == 0 else []
        if ports:
            self._ports = ports
        elif not self._ports:
            raise RuntimeError(f"ibnetdiscover found no fabric: {_describe(result)}")
        else:
            self._log_once(f"ibnetdiscover failed, keeping the previous topology: {_describe(result)}")

    async def _run(self, argv: Sequence[str]) -> CommandResult:
        async with self._semaphore:
            return await self._runner.run(argv, self._opts.timeout_seconds)

    async def _target_readings(self, target: FabricTarget, switches: dict[str, str]) -> list[Reading]:
        blocks = await self._perfquery(self._opts.perfquery_command, target.guid, None)
        if self._opts.perfquery_errors_command:
            cabled = sorted(p for p, line in target.ports.items() if line.remote is not None)
            details = await asyncio.gather(
                *(self._perfquery(self._opts.perfquery_errors_command, target.guid, p) for p in cabled)
            )
            blocks += [b for found in details for b in found]
        out = []
        for block in blocks:
            labels = labels_of(remote_labels(target.ports.get(block.port), switches))
            out += block_readings(target.device, block, labels)
        return out

    async def _perfquery(self, template: Sequence[str], guid: str, port: int | None) -> list[PerfBlock]:
        argv = [w.replace("{guid}", guid).replace("{port}", "" if port is None else str(port)) for w in template]
        result = await self._run([w for w in argv if w])
        if result.returncode != 0:
            self._log_once(f"{argv[0]} {guid}: {_describe(result)}")
            return []
        blocks = parse_perfquery(result.output)
        if not blocks:
            self._log_once(f"{argv[0]} {guid}: no counters in the output")
        return blocks

    async def _ibstat_readings(self, argv: Sequence[str]) -> list[Reading]:
        result = await self._run(argv)
        parsed = parse_ibstat(result.output)
        for error in parsed.errors:
            self._log_once(f"ibstat: {error}")
        if result.returncode != 0 and not parsed.ports:
            self._log_once(f"ibstat: {_describe(result)}")
        return [r for p in parsed.ports for r in status_readings(p)]

    def _log_once(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.warning("ibfabric: %s", message)


def _describe(result: CommandResult) -> str:
    if result.timed_out:
        return "timed out"
    if result.error:
        return result.error
    tail = result.output.strip().splitlines()[-1:] or [""]
    return f"exit status {result.returncode}: {tail[0][:200]}"
