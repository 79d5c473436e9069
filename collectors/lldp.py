"""LLDP neighbours from lldpd (a real daemon, Debian package ``lldpd``), for topology discovery.

Each scrape runs ``lldpctl -f json`` (the neighbours heard on each local interface) and, when
configured, ``lldpcli show chassis -f json`` (this machine's own chassis: its name and whether it
bridges or routes). lldpd does the protocol; fabricd only reads what it heard. Readings (INFO, value
1, what they say in labels):

- ``neighbor_info`` per local interface (``device``): ``chassis`` (the neighbour's system name),
  ``chassis_id``, ``port_id``, ``port_id_type``, ``port_descr``, ``port`` (its interface name:
  the port id when it is one, else the description), ``mgmt_ip`` (comma separated),
  ``capabilities`` (enabled: Bridge, Router, Station, ...);
- ``chassis_info`` (``device`` empty): this machine's ``chassis``, ``chassis_id``, ``capabilities``.

The central assembles the fabric graph from these (docs/topology.md). A failed ``lldpctl`` (lldpd
not running) fails the scrape with its message; a neighbour lldpd could not describe is skipped and
logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field

from fabricd.collector import CollectorContext, CollectorFactories, CollectorOptions
from fabricd.command import CommandRunner, SubprocessRunner
from fabricd.model import Kind, Reading, labels_of
from fabricd.parsers.lldp import LldpChassis, LldpNeighbour, parse_lldp_chassis_json, parse_lldpctl_json

SOURCE = "lldp"
log = logging.getLogger(__name__)


class LldpOptions(CollectorOptions):
    command: list[str] = Field(default_factory=lambda: ["lldpctl", "-f", "json"], min_length=1)
    # this machine's chassis (name, capabilities); [] to skip
    chassis_command: list[str] = Field(default_factory=lambda: ["lldpcli", "show", "chassis", "-f", "json"])
    timeout_seconds: float = Field(default=10.0, gt=0)


@dataclass(frozen=True, slots=True)
class LldpFactories(CollectorFactories):
    runner: type[CommandRunner] = SubprocessRunner


class LldpCollector:
    name: ClassVar[str] = "lldp"
    Options = LldpOptions

    def __init__(self, ctx: CollectorContext) -> None:
        assert isinstance(ctx.options, LldpOptions)
        self._opts = ctx.options
        self._runner = ctx.factories_for(LldpFactories).runner()
        self._logged: set[str] = set()

    async def collect(self) -> Sequence[Reading]:
        text = await self._output(self._opts.command)
        parsed = parse_lldpctl_json(text)
        if parsed.problems and not parsed.neighbours and text.strip():
            raise RuntimeError(f"{' '.join(self._opts.command)}: {parsed.problems[0].message}")
        for p in parsed.problems:
            self._log_once(f"lldp: {p.message}")
        out = [neighbour_reading(n) for n in parsed.neighbours]
        if self._opts.chassis_command:
            chassis, problems = parse_lldp_chassis_json(await self._output(self._opts.chassis_command))
            if chassis is not None:
                out.append(chassis_reading(chassis))
            for p in problems:
                self._log_once(f"lldp chassis: {p.message}")
        return out

    async def _output(self, argv: Sequence[str]) -> str:
        result = await self._runner.run(argv, self._opts.timeout_seconds)
        if result.returncode != 0:
            why = "timed out" if result.timed_out else result.error or f"exited {result.returncode}"
            raise RuntimeError(f"{' '.join(argv)} {why}: {result.output.strip()[:300]}")
        return result.output

    def _log_once(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.warning("%s", message)


def neighbour_reading(n: LldpNeighbour) -> Reading:
    labels = labels_of(
        {
            "chassis": n.chassis.name,
            "chassis_id": n.chassis.id,
            "port_id": n.port_id,
            "port_id_type": n.port_id_type,
            "port_descr": n.port_descr,
            "port": n.port_name,
            "mgmt_ip": ",".join(n.chassis.mgmt_ip),
            "capabilities": ",".join(sorted(n.chassis.capabilities)),
        }
    )
    return Reading(SOURCE, n.local_port, "", "neighbor", 1.0, "", Kind.INFO, labels, "neighbor_info", 0)


def chassis_reading(c: LldpChassis) -> Reading:
    labels = labels_of({"chassis": c.name, "chassis_id": c.id, "capabilities": ",".join(sorted(c.capabilities))})
    return Reading(SOURCE, "", "", "chassis", 1.0, "", Kind.INFO, labels, "chassis_info", 0)
