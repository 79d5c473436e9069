"""The fabric graph the central assembles from what its agents report (issue 16 §2): each agent's
``lldp`` collector readings (``neighbor_info``, ``chassis_info``) become one ``LldpReport``; the
``ibfabric`` collector's ``cable_info`` readings (one per cabled port ``ibnetdiscover`` found) the
InfiniBand part. The parts merge into one topology, with its problems (one-sided links, cables
whose ends disagree) and, against the stored topology, its changes (new switches, recabled ports,
links gone)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fabricd.model import Reading, Sample
from fabricd.topology import ibnet
from fabricd.topology.diff import Change, diff
from fabricd.topology.document import from_doc, to_doc
from fabricd.topology.lldp import from_lldp, report_from_readings
from fabricd.topology.merge import merge
from fabricd.topology.model import Topology


@dataclass(slots=True)
class Discovered:
    document: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)


def discovered(
    lldp: Iterable[tuple[str, Sample]],
    stored: dict[str, Any] | None,
    link_layer: str = "roce",
    ibfabric: Iterable[tuple[str, Sample]] = (),
) -> Discovered:
    """``lldp``, ``ibfabric``: the newest sample of each series of that source, with its node;
    ``stored``: the current topology document (None when none was uploaded)."""
    parts: list[Topology] = []
    problems: list[str] = []
    ib = [r for readings in newest_scrape(ibfabric).values() for r in readings]
    ports = list({(p.local.guid, p.local.port): p for p in ibnet.ports_from_readings(ib)}.values())
    if ports:
        parts.append(ibnet.from_ports(ports))
        problems += ibnet.problems(ports)
    reports = [report_from_readings(node, readings) for node, readings in sorted(newest_scrape(lldp).items())]
    if reports or not parts:
        found = from_lldp(reports, link_layer)
        parts.append(found.topology)
        problems += found.problems
    topology = merge(parts)
    changes = diff(from_doc(stored) if stored is not None else from_doc({}), topology)
    return Discovered(to_doc(topology), problems, changes)


def newest_scrape(samples: Iterable[tuple[str, Sample]]) -> dict[str, list[Reading]]:
    """Per node, the readings of its newest scrape. Each series keeps its last sample for a while
    after the source stops seeing it (a moved cable): what a machine sees now is its newest scrape,
    and the agent stamps every sample of one scrape with the scrape's time (ScrapePipeline.samples),
    so those are the samples with its newest ts."""
    samples = list(samples)
    newest: dict[str, float] = {}
    for node, sample in samples:
        newest[node] = max(sample.ts, newest.get(node, sample.ts))
    by_node: dict[str, list[Reading]] = {}
    for node, sample in samples:
        if sample.ts == newest[node]:
            by_node.setdefault(node, []).append(sample.reading)
    return by_node
