"""What a batch says about probe paths: the pingmesh collector's ``path_info`` readings (and the
ibfabric collector's, InfiniBand paths by ibtracert), taken out before storage (as job info readings are: a path that changes must not grow the series table).

Each reading is one trace of one probed pair's 5-tuple (``collectors/pingmesh.py``): the hop
addresses raw, in TTL order. They go to the paths table (``store/paths.py``); the central maps the
addresses to topology elements when it reads them (``fabricd.topology.traced``), so a topology or
an address learned later still places a path traced earlier.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fabricd.model import Batch, Kind, Sample
from fabricd.wire_columns import SampleColumns

SOURCE = "pingmesh"
NAME = "path_info"
SILENT = "*"


@dataclass(frozen=True, slots=True)
class PathReport:
    """One trace: from ``node`` (source address and port) to ``peer`` (address and port)."""

    node: str
    peer: str
    ts: float  # the scrape that reported it (event time)
    src: str
    src_port: int
    dst: str
    dst_port: int
    hops: tuple[str | None, ...]  # None: a silent hop
    reached: bool
    # "reply": the path of ``node``'s replies to the prober ``peer`` (src is node's end), traced by
    # the responder with the reply's 5-tuple; "request": ``node``'s probes to ``peer``
    direction: str = "request"


# The ibfabric collector traces InfiniBand pairs with ibtracert from one host with SM access
# (collectors/ibfabric.py path_reading): the same record, hops are GUIDs (the switches', then the
# destination port's), and the pair's source host is its ``src_node`` label, not the reporting agent.
IB_SOURCE = "ibfabric"
_SOURCES = (SOURCE, IB_SOURCE)


def _is_path(s: Sample) -> bool:
    r = s.reading
    return r.source in (SOURCE, IB_SOURCE) and r.kind is Kind.INFO and r.name == NAME


def _port(text: str) -> int:
    return int(text) if text.isdigit() else 0


def parse_path(node: str, s: Sample) -> PathReport:
    labels = dict(s.reading.labels)
    hops = tuple(None if h == SILENT else h for h in labels.get("hops", "").split())
    if s.reading.source == IB_SOURCE:
        node = labels.get("src_node", "")
    return PathReport(
        node,
        s.reading.device,
        s.ts,
        labels.get("src", ""),
        _port(labels.get("src_port", "")),
        labels.get("dst", ""),
        _port(labels.get("dst_port", "")),
        hops,
        labels.get("reached") == "true",
        "reply" if labels.get("direction") == "reply" else "request",
    )


def split_paths(batch: Batch) -> tuple[list[PathReport], Batch]:
    """The batch's traces (oldest first), and the batch without them."""
    samples = batch.samples
    if isinstance(samples, SampleColumns):  # decoded by ingest: the columns, no sample built
        if samples.sources.isdisjoint(_SOURCES):
            return [], batch
        paths = [
            src in _SOURCES and kind == Kind.INFO and name == NAME
            for src, kind, name in zip(samples.source, samples.kind, samples.name, strict=True)
        ]
        if not any(paths):
            return [], batch
        found = sorted((parse_path(batch.node, s) for s in samples.where(paths)), key=lambda r: r.ts)
        return found, replace(batch, samples=samples.where(not p for p in paths))
    # The sources first, without a call a sample: most batches have no path source at all.
    if not any(s.reading.source in _SOURCES for s in batch.samples) or not any(map(_is_path, batch.samples)):
        return [], batch
    reports = sorted((parse_path(batch.node, s) for s in batch.samples if _is_path(s)), key=lambda r: r.ts)
    return reports, replace(batch, samples=[s for s in batch.samples if not _is_path(s)])
