"""The topology detection localizes over: the pushed document and what discovery finds, as one.

The rule (docs/topology.md, "Which topology detection uses"):

- nothing pushed (``PUT /api/v1/topology``): the discovered graph (the agents' LLDP, the
  ``ibfabric`` collector's ``ibnetdiscover`` cables) is the topology;
- pushed, nothing discovered: the pushed document;
- both: the pushed document, plus what discovery finds that it does not name. A pushed document is
  authoritative for what it names: a host it lists keeps its HCA ports and host links (discovery
  on RoCE names a host's port by its interface, the pushed document may name it by its RDMA
  device), a switch keeps its tier; discovered switches, hosts and cables it lacks are added. Its
  routes are kept.

``get()`` has the shape of the stored topology's reader, so the detector follows it as it follows a
push: ``updated_ts`` moves only when the active document changes (a discovered graph that stays
the same costs the engine nothing), and a topology that is neither pushed nor discovered is
``NotFound``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fabricd.server.store.protocols import LatestReader, TopologyReader
from fabricd.server.store.records import NotFound, TopologyRecord
from fabricd.server.topology_watch import discovery_samples
from fabricd.topology import Topology, from_doc, to_doc
from fabricd.topology.assemble import discovered


class ActiveTopology:
    def __init__(
        self, stored: TopologyReader, latest: LatestReader, fresh_seconds: float, clock: Callable[[], float]
    ) -> None:
        self.stored, self.latest, self.fresh_seconds, self.clock = stored, latest, fresh_seconds, clock
        self._last: tuple[str, TopologyRecord] | None = None  # (document as JSON, its record)

    def get(self, name: str = "default") -> TopologyRecord:
        try:
            pushed: TopologyRecord | None = self.stored.get(name)
        except NotFound:
            pushed = None
        now = self.clock()
        found = self._discovered(now)
        if found is None:
            if pushed is None:
                raise NotFound(f"topology {name!r}: none pushed and none discovered")
            return pushed
        doc = found if pushed is None else combine(pushed.doc, found)
        return self._record(name, doc, now)

    def _discovered(self, now: float) -> dict[str, Any] | None:
        fresh = now - self.fresh_seconds
        lldp = self.latest.values(source="lldp", fresh_since=fresh)
        cables = discovery_samples(self.latest, fresh)
        if not lldp and not cables:
            return None
        doc = discovered(lldp, None, ibfabric=cables).document
        return doc if doc["links"] else None

    def _record(self, name: str, doc: dict[str, Any], now: float) -> TopologyRecord:
        text = json.dumps(doc, sort_keys=True)
        if self._last is None or self._last[0] != text:
            self._last = (text, TopologyRecord(name, now, doc))
        return self._last[1]


def combine(pushed: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
    """``pushed`` plus what ``found`` has that it does not name (the module's rule)."""
    base, extra = from_doc(pushed), from_doc(found)
    hosts = set(base.nodes)
    for sw in extra.switches.values():
        if sw.id not in hosts:
            base.add_switch(sw)  # setdefault: a pushed switch keeps its tier
    for hca in extra.hca_ports.values():
        if hca.node not in hosts and hca.node not in base.switches:
            base.add_hca_port(hca)
    for link in extra.links.values():
        if _known(base, link.a) and _known(base, link.b) and not _pushed_host(hosts, base, link.a):
            connect = base.connect_host if link.kind == "host" else base.connect_switches
            for cable in link.ports or (None,):
                connect(link.a, link.b, cable)
    doc = to_doc(base)
    if pushed.get("routes"):
        doc["routes"] = pushed["routes"]
    return doc


def _known(topo: Topology, element: str) -> bool:
    return element in topo.switches or element in topo.hca_ports


def _pushed_host(hosts: set[str], topo: Topology, end: str) -> bool:
    """Whether ``end`` is an HCA port of a host the pushed document lists (its links are the push's)."""
    hca = topo.hca_ports.get(end)
    return hca is not None and hca.node in hosts
