"""NCCL RAS ``STATUS`` text report, parsed (the asking is ``fabricd/ras.py``).

The report starts with ``NCCL version X.Y.Z compiled with CUDA ...`` and has a ``Job summary`` table,
a ``Communicators`` table (per group: comms, nodes, ranks per node, ranks per comm, ranks in group,
status, errors) and ``Errors`` / ``Warnings`` sections (NVIDIA/nccl ``src/ras/client_support.cc``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fabricd.parsers.common import Problem, problem

# One row of the Communicators table. "Ranks per node" is printed "%d" or, when the communicators of a
# group differ, "%d-%d" (NVIDIA/nccl src/ras/client_support.cc: ``snprintf(rasLine, ..., "%d-%d",
# ranksPerNodeMin, ranksPerNodeMax)`` then ``"%5d  %8d  %8d  %8s  ..."``; the NCCL RAS docs show
# ``0  1  4  7-8  32  32  RUNNING  INCOMPLETE`` for a job with one process stopped).
_GROUP_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)(?:-(\d+))?\s+(\d+)\s+(\d+)\s+([A-Z_]+)\s+(\S+)\s*$")
# The table's own header opens the section too: reports are pasted from it on, without the
# ``Communicators... (0.002s)`` title (NVIDIA/nccl docs/examples/08_ras/01_fault_detection, the
# straggler walkthrough; NVIDIA's NCCL 2.24 blog post, whose rendered text also collapses the blanks).
_TABLE_HEADER = re.compile(r"^\s*Group\s+Comms\s+Nodes\b")


@dataclass(frozen=True, slots=True)
class CommGroup:
    group: int
    comms: int
    nodes: int
    ranks_per_node: int
    ranks_per_comm: int
    ranks: int
    status: str
    errors: str
    ranks_per_node_max: int | None = None  # "7-8": ranks_per_node is 7, this 8; None when one number


@dataclass(slots=True)
class RasReport:
    version: str = ""
    groups: list[CommGroup] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # lines of the Errors section
    warnings: list[str] = field(default_factory=list)
    # A Communicators section was read (its title, its table's header). With no group it is still a
    # report: RAS prints "No communicator data collected!" there once the survivors have torn their
    # communicators down, and a DEAD process stays under Errors (NVIDIA/nccl src/ras/client_support.cc).
    communicators: bool = False


def parse_status(text: str) -> RasReport:
    """The text report of ``STATUS``."""
    report, section = RasReport(), ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("NCCL version "):
            report.version = stripped.split()[2]
        elif stripped in ("Job summary", "Errors", "Warnings") or stripped.startswith("Communicators"):
            section = stripped.split()[0].rstrip(".")
            report.communicators |= section == "Communicators"
        elif _TABLE_HEADER.match(line):
            section, report.communicators = "Communicators", True
        elif set(stripped) <= {"="} or not stripped:
            continue
        elif section == "Communicators" and (m := _GROUP_ROW.match(line)):
            report.groups.append(_group(m))
        elif section == "Errors":
            report.errors.append(stripped)
        elif section == "Warnings":
            report.warnings.append(stripped)
    return report


def _group(m: re.Match[str]) -> CommGroup:
    group, comms, nodes, per_node, per_node_max, per_comm, ranks, status, errors = m.groups()
    high = int(per_node_max) if per_node_max else None
    return CommGroup(int(group), int(comms), int(nodes), int(per_node), int(per_comm), int(ranks), status, errors, high)


def problems(text: str, report: RasReport) -> list[Problem]:
    """Why ``text`` is not a RAS report: no version line and no Communicators section read."""
    if report.version or report.communicators:
        return []
    first = next((line for line in text.splitlines() if line.strip()), "")
    return [problem(0, "not an NCCL RAS status report: no 'NCCL version' line and no Communicators table", first)]
