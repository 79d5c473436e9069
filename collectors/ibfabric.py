"""InfiniBand switch port counters for a whole fabric, from one management node.

Topology comes from ``ibnetdiscover -p``; counters from ``perfquery -x`` (PortCountersExtended)
per switch and, optionally, ``perfquery -E`` (PortRcvErrorDetails) per cabled switch port. Every
switch port reading carries the far end of its cable (``remote``, ``remote_port``,
``remote_type``), which is what a user needs to walk to the right cable.

The tools run through ``fabricd.command.CommandRunner`` (one async method with a timeout; tests
swap it through ``IbFabricFactories``), with at most ``concurrency`` commands at once. The commands are settings, with
``{guid}`` and ``{port}`` placeholders. Parsing is pure and lives in ``fabricd.parsers``
(``perfquery``, ``ibqueryerrors``, ``ibstat``, ``ibnetdiscover``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field, field_validator

from fabricd.collector import CollectorContext, CollectorFactories, CollectorOptions
from fabricd.command import CommandResult, CommandRunner, SubprocessRunner
from fabricd.drivers.ib.perfquery import PerfSpec
from fabricd.ibtracing import IbTracer, TraceParams
from fabricd.model import Kind, Labels, Reading, labels_of
from fabricd.parsers.ibnetdiscover import IbnetEnd, IbnetPort, parse_ibnetdiscover
from fabricd.parsers.ibqueryerrors import IbqueryerrorsResult, PortField, parse_ibqueryerrors
from fabricd.parsers.ibstat import IbPortStatus, parse_ibstat
from fabricd.parsers.perfquery import PerfBlock, counter_spec, parse_perfquery
from fabricd.topology import end_id, switch_ids
from fabricd.topology.ibnet import ca_ids

log = logging.getLogger(__name__)

SOURCE = "ibfabric"
GBIT_BYTES_PER_SECOND = 125_000_000
MAX_LABEL_CHARS = 128


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


# The cable_info labels: what ``fabricd.topology.ibnet.ports_from_readings`` needs to rebuild the
# ibnetdiscover port line at the central. No LIDs: the SM may renumber them, which would start new
# series for an unchanged cable.
CABLE_LABELS = ("guid", "type", "desc", "width", "speed", "remote_guid", "remote_type", "remote_port", "remote_desc")


def cable_readings(ports: Sequence[IbnetPort]) -> list[Reading]:
    """Every cabled port as ibnetdiscover saw it (INFO ``cable_info``, value 1; device = the port's
    element id), for the central's fabric graph (docs/topology.md). Uncabled ports carry no cable."""
    switches, cas = switch_ids(ports), ca_ids(ports)
    out = []
    for port in ports:
        here, far = port.local, port.remote
        if far is None:
            continue
        values = (here.guid, here.type, here.desc, port.width, port.speed, far.guid, far.type, str(far.port), far.desc)
        labels = labels_of({k: _bounded(v) for k, v in zip(CABLE_LABELS, values, strict=True)})
        device = _bounded(end_id(here, switches, cas))
        out.append(Reading(SOURCE, device, str(here.port), "cable", 1.0, "", Kind.INFO, labels, "cable_info", 0))
    return out


def field_reading(device: str, port: int, raw: str, value: int, spec: PerfSpec, labels: Labels) -> Reading:
    return Reading(
        SOURCE,
        device,
        str(port),
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


def block_readings(device: str, block: PerfBlock, labels: Labels) -> list[Reading]:
    out = []
    for raw, value in block.counters.items():
        spec = counter_spec(block, raw, value)
        if spec is not None:
            out.append(field_reading(device, block.port, raw, value, spec, labels))
    return out


ErrorFields = dict[tuple[str, int], list[PortField]]  # (port GUID, port) -> ibqueryerrors fields


def error_fields(result: IbqueryerrorsResult) -> ErrorFields:
    """ibqueryerrors' per-port fields by (port GUID, port); ``port ALL`` sums are left out."""
    out: ErrorFields = {}
    for i, port in enumerate(result.ports):
        if isinstance(port.port, int) and port.guid:
            out.setdefault((port.guid, port.port), []).extend(result.fields.get(i, []))
    return out


def extra_readings(device: str, port: int, fields: list[PortField], have: set[str], labels: Labels) -> list[Reading]:
    """ibqueryerrors fields perfquery -x did not already give (the --details ones): one source a series."""
    return [
        field_reading(device, port, f.raw, f.value, f.spec, labels)
        for f in fields
        if f.spec is not None and f.spec.name not in have
    ]


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
    # One fabric-wide run instead of perfquery_errors_command's one command per cabled port; what it
    # adds to perfquery -x is the --details fields (PortRcvErrorDetails, PortXmitDiscardDetails).
    ibqueryerrors_command: list[str] | None = None
    include_hcas: bool = False  # also query CA ports (HCAs); switches only by default
    concurrency: int = Field(default=8, ge=1, le=256)
    timeout_seconds: float = Field(default=10.0, gt=0)
    rediscover_every: int = Field(default=60, ge=1)  # scrapes between ibnetdiscover runs
    # Send what ibnetdiscover found (one cable_info reading per cabled port, every scrape) so the
    # central keeps its fabric graph current (docs/topology.md "InfiniBand").
    report_cables: bool = True
    # ibtracert between the HCA ports of trace_nodes (the pingmesh / NCCL peers: every ordered pair,
    # first HCA port of each), sent as path_info readings, the traced paths the central turns into
    # the localizer's routes (fabricd.topology.ibroute, fabricd/server/pathreports.py).
    ibtracert_command: list[str] = Field(default=["ibtracert", "{src_lid}", "{dst_lid}"], min_length=1)
    trace_nodes: list[str] = []
    # Traces per scrape (one SMP per hop each, from this host): all pairs are traced again after each
    # rediscovery, this many a scrape, so the SM and the switches never see a burst.
    trace_pairs_per_scrape: int = Field(default=8, ge=1, le=256)
    max_trace_pairs: int = Field(default=1024, ge=1)
    # The SM runs adaptive routing (NVIDIA ar_updn, Quantum AR): a traced path is only the static
    # fallback: pairs are reported with no path (reason adaptive) and keep every equal-cost candidate.
    adaptive_routing: bool = False

    @field_validator("perfquery_command", "perfquery_errors_command")
    @classmethod
    def _needs_guid(cls, argv: list[str] | None) -> list[str] | None:
        if argv is not None and not any("{guid}" in word for word in argv):
            raise ValueError("the command must contain a {guid} placeholder")
        return argv

    @field_validator("ibtracert_command")
    @classmethod
    def _needs_lids(cls, argv: list[str]) -> list[str]:
        for placeholder in ("{src_lid}", "{dst_lid}"):
            if not any(placeholder in word for word in argv):
                raise ValueError(f"the command must contain a {placeholder} placeholder")
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
        self._cables: list[Reading] = []  # cable_info of the last discovery, resent every scrape
        self._scrapes = 0
        self._logged: set[str] = set()
        params = TraceParams(
            self._opts.ibtracert_command,
            self._opts.trace_nodes,
            self._opts.trace_pairs_per_scrape,
            self._opts.max_trace_pairs,
            self._opts.adaptive_routing,
        )
        self._tracer = IbTracer(params, self._run, self._log_once)

    async def collect(self) -> Sequence[Reading]:
        if await self._refresh_topology() and self._opts.trace_nodes:
            self._tracer.plan(self._ports)
        switches = switch_ids(self._ports)
        targets = fabric_targets(self._ports, self._opts.include_hcas)
        errors = await self._ibqueryerrors() if self._opts.ibqueryerrors_command else None
        jobs = [self._target_readings(t, switches, errors) for t in targets]
        if self._opts.ibstat_command:
            jobs.append(self._ibstat_readings(self._opts.ibstat_command))
        jobs.append(self._tracer.trace_some(self._ports))
        cables = self._cables if self._opts.report_cables else []
        return cables + [r for batch in await asyncio.gather(*jobs) for r in batch]

    async def _refresh_topology(self) -> bool:
        """Run ibnetdiscover when due; True when it gave a (new) fabric."""
        self._scrapes += 1
        if self._ports and (self._scrapes - 1) % self._opts.rediscover_every:
            return False
        result = await self._run(self._opts.ibnetdiscover_command)
        ports = parse_ibnetdiscover(result.output).ports if result.returncode == 0 else []
        if ports:
            self._ports = ports
            self._cables = cable_readings(ports)  # built once a discovery: 13 ms for 318 cables
            return True
        if not self._ports:
            raise RuntimeError(f"ibnetdiscover found no fabric: {_describe(result)}")
        self._log_once(f"ibnetdiscover failed, keeping the previous topology: {_describe(result)}")
        return False

    async def _run(self, argv: Sequence[str]) -> CommandResult:
        async with self._semaphore:
            return await self._runner.run(argv, self._opts.timeout_seconds)

    async def _target_readings(
        self, target: FabricTarget, switches: dict[str, str], errors: ErrorFields | None
    ) -> list[Reading]:
        blocks = await self._perfquery(self._opts.perfquery_command, target.guid, None)
        if errors is None and self._opts.perfquery_errors_command:
            cabled = sorted(p for p, line in target.ports.items() if line.remote is not None)
            details = await asyncio.gather(
                *(self._perfquery(self._opts.perfquery_errors_command, target.guid, p) for p in cabled)
            )
            blocks += [b for found in details for b in found]
        out = []
        for block in blocks:
            labels = labels_of(remote_labels(target.ports.get(block.port), switches))
            out += block_readings(target.device, block, labels)
        for port in sorted(target.ports) if errors is not None else ():
            have = {r.name for r in out if r.port == str(port)}
            labels = labels_of(remote_labels(target.ports.get(port), switches))
            fields = errors.get((target.guid, port), []) if errors is not None else []
            out += extra_readings(target.device, port, fields, have, labels)
        return out

    async def _ibqueryerrors(self) -> ErrorFields:
        assert self._opts.ibqueryerrors_command is not None
        result = await self._run(self._opts.ibqueryerrors_command)
        parsed = parse_ibqueryerrors(result.output)
        for p in parsed.problems:  # exit status 1 only says errors were found (ibqueryerrors(8))
            self._log_once(f"ibqueryerrors: line {p.line}: {p.message}: {p.text}")
        return error_fields(parsed)

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
