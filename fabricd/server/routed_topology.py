"""The stored topology with the agents' traced routes merged in (issue 16 §4): what detection and
``GET /api/v1/topology`` read. Traced paths are stored raw (``store/paths.py``); here their hop
addresses are mapped to elements (``fabricd.topology.traced``) with the stored document, the
agents' LLDP and the traces themselves, and merged with the uploaded routes (newer wins per pair).

``get`` has ``TopologyReader``'s shape, so the detector follows traced routes as it follows an
upload: a new or changed route moves ``updated_ts`` (this service's clock) and the detector reloads
without a restart. The merge is redone only when the document, a path or the addresses changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fabricd.server.store.protocols import LatestReader, PathReader, TopologyReader
from fabricd.server.store.records import PathRecord, TopologyRecord
from fabricd.topology import from_doc
from fabricd.topology.traced import Trace, address_owners, merge_routes, traced_routes


def trace_of(p: PathRecord) -> Trace:
    return Trace(p.node, p.peer, p.src, p.dst, p.hops, p.traced_ts, p.version, p.direction)


class RoutedTopology:
    def __init__(
        self,
        topology: TopologyReader,
        paths: PathReader,
        latest: LatestReader,
        fresh_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.topology, self.paths, self.latest = topology, paths, latest
        self.fresh_seconds, self.clock = fresh_seconds, clock
        self._key: Any = None
        self._routes: list[dict[str, Any]] = []
        self._changed_ts = 0.0  # when the merged routes last changed (this service's clock)

    def get(self, name: str = "default") -> TopologyRecord:
        row = self.topology.get(name)  # NotFound: nothing to route over
        traces = [trace_of(p) for p in self.paths.all()]
        lldp = self.latest.values(source="lldp", fresh_since=self.clock() - self.fresh_seconds)
        owners = address_owners(row.doc, lldp, traces)
        key = (row.name, row.updated_ts, self.paths.generation, tuple(sorted(owners.items())))
        if key != self._key:
            traced = traced_routes(from_doc(row.doc), traces, owners) if traces else []
            routes = merge_routes(row.doc, row.updated_ts, traced)
            if routes != self._routes:
                self._changed_ts = self.clock()
            self._key, self._routes = key, routes
        # Without traced routes the document is as uploaded, its time the upload's.
        traced_in_use = any(r.get("source") == "trace" for r in self._routes)
        updated = max(row.updated_ts, self._changed_ts) if traced_in_use else row.updated_ts
        return TopologyRecord(row.name, updated, {**row.doc, "routes": self._routes})
