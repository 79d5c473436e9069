"""ibtracert beside the ibfabric collector (issue 16 §4): which pairs to trace when, the traces,
and each path as the ``path_info`` reading the central's paths take (fabricd/server/pathreports.py).

After each ibnetdiscover run every pair of ``trace_nodes`` is queued again (an SM sweep may have
rewritten the forwarding tables); each scrape traces the next ``per_scrape`` of them, so the
switches' SMAs and the SM never see a burst; each ibtracert goes through the collector's runner
(its concurrency and timeout). Which pairs, and the hops of a trace: ``fabricd.topology.ibroute``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from fabricd.command import CommandResult
from fabricd.model import Kind, Reading, labels_of
from fabricd.parsers.ibnetdiscover import IbnetPort
from fabricd.parsers.ibtracert import parse_ibtracert
from fabricd.topology.ibnet import from_ports
from fabricd.topology.ibroute import NAME, SOURCE, hca_lids, path_switches, trace_pairs

ADAPTIVE = "adaptive"  # a path_info reason: adaptive routing, no single path (its hops are empty)
SWEEP = "sweep"  # a path_info reason: traced after a discovery
MAX_LABEL_CHARS = 128  # the central's limits.max_label_value_length default
Run = Callable[[Sequence[str]], Awaitable[CommandResult]]


@dataclass(frozen=True, slots=True)
class TraceParams:
    command: Sequence[str]  # with {src_lid} and {dst_lid}
    nodes: Sequence[str]
    per_scrape: int
    max_pairs: int
    adaptive: bool


def path_reading(node: str, peer: str, src_guid: str, dst_guid: str, hops: Sequence[str], reason: str) -> Reading:
    """One traced pair as the central's paths take it: INFO ``path_info``, device = the destination
    host; labels ``src_node``, ``src`` and ``dst`` (the two HCA port GUIDs), ``hops`` (the switches'
    GUIDs in path order, then the destination port's: the central places GUIDs as it places IP hops,
    by each element's ``guid`` in the topology), ``reached``, ``reason``."""
    labels = {
        "src_node": node,
        "src": src_guid,
        "dst": dst_guid,
        "hops": " ".join(hops),
        "reached": str(bool(hops)).lower(),
        "reason": reason,
    }
    return Reading(SOURCE, peer, "", "path", 1.0, "", Kind.INFO, labels_of(labels), NAME, 0)


class IbTracer:
    def __init__(self, params: TraceParams, run: Run, log_once: Callable[[str], None]) -> None:
        self.params, self.run, self.log_once = params, run, log_once
        self.untraced: deque[tuple[str, str]] = deque()  # HCA port pairs waiting for their trace

    def plan(self, ports: Sequence[IbnetPort]) -> None:
        """Queue every pair again (after an ibnetdiscover run)."""
        limit = self.params.max_pairs
        pairs = list(itertools.islice(trace_pairs(from_ports(ports), self.params.nodes), limit + 1))
        if len(pairs) > limit:
            self.log_once(f"ibtracert: more than max_trace_pairs={limit} pairs; tracing the first")
        self.untraced = deque(pairs[:limit])

    async def trace_some(self, ports: Sequence[IbnetPort]) -> list[Reading]:
        """The next ``per_scrape`` pairs' paths, each reported once."""
        lids = hca_lids(ports)
        nodes = {hca: p.node for hca, p in from_ports(ports).hca_ports.items()}
        todo = [self.untraced.popleft() for _ in range(min(len(self.untraced), self.params.per_scrape))]
        found = await asyncio.gather(*(self._trace(p, lids, nodes) for p in todo))
        return [r for r in found if r is not None]

    async def _trace(
        self, pair: tuple[str, str], lids: dict[str, tuple[int, str]], nodes: dict[str, str]
    ) -> Reading | None:
        src, dst = pair
        if src not in lids or dst not in lids:
            self.log_once(f"ibtracert {src} -> {dst}: no LID in the ibnetdiscover output")
            return None
        (src_lid, src_guid), (dst_lid, dst_guid) = lids[src], lids[dst]
        if self.params.adaptive:  # the static path is not where packets go: say so, trace nothing
            return path_reading(nodes[src], nodes[dst], src_guid, dst_guid, (), ADAPTIVE)
        values = {"{src_lid}": str(src_lid), "{dst_lid}": str(dst_lid)}
        result = await self.run([_fill(word, values) for word in self.params.command])
        trace = parse_ibtracert(result.output)
        switches = path_switches(trace, dst_guid) if result.returncode == 0 else None
        if switches is None:
            why = trace.problems[-1].message if trace.problems else _describe(result)
            self.log_once(f"ibtracert {src} -> {dst}: no path: {why}")
            return None
        hops = (*switches, dst_guid)
        if len(" ".join(hops)) > MAX_LABEL_CHARS:
            self.log_once(f"ibtracert {src} -> {dst}: {len(switches)} switches do not fit one label; not sent")
            return None
        return path_reading(nodes[src], nodes[dst], src_guid, dst_guid, hops, SWEEP)


def _fill(word: str, values: dict[str, str]) -> str:
    for placeholder, value in values.items():
        word = word.replace(placeholder, value)
    return word


def _describe(result: CommandResult) -> str:
    if result.timed_out:
        return "timed out"
    return result.error or f"exit status {result.returncode}"
