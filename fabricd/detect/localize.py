"""Localization: the smallest topology element that explains a set of symptoms.

Symptoms come in two shapes:

* a *pair* symptom (pingmesh loss or RTT between two nodes): the elements on the pair's path. When a
  path oracle knows the path a probe takes (traceroute / ibtracert, or the switches' ECMP hash
  model; the simulator provides its own) the path is exact; otherwise every ECMP alternative from
  ``Topology.paths`` is a candidate and an element gets the fraction of alternatives containing it;
* a *port* symptom (the port's own counters): the HCA port, its host link and its node.

Scoring (007's votes with NetBouncer's "a healthy path clears its elements"): for each element,
``bad`` = sum of symptom weights x fraction of the symptom's alternatives that contain it, ``good`` =
the same over healthy pairs; score = ``bad / total_bad x bad / (bad + good)``: the share of the
symptoms it explains times how consistently its paths are bad. The best element is taken, the
symptoms it explains are removed, and the rest is explained again (greedy set cover), so two faults
give two clusters. Ties go to the smallest element (a link before a switch or a node).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fabricd.model import Candidate

# Tie-break: smaller elements first (a link explains less than the switch it hangs off).
_RANK = {"fabric_link": 0, "host_link": 1, "hca": 2, "switch": 3, "node": 4}
TOP_CANDIDATES = 5
PathOracle = Callable[[str, str], Collection[str] | None]


def element_type(element: str) -> str:
    if "~" in element:
        return "host_link" if "/" in element else "fabric_link"
    if "/" in element:
        return "hca"
    return "node" if element.startswith("node") or "-" not in element else "switch"


@dataclass(frozen=True, slots=True)
class Symptom:
    """Something observed bad (or, in ``healthy``, observed fine) and where it could come from."""

    ref: Any  # what the caller wants back (a finding, a pair)
    alternatives: tuple[frozenset[str], ...]
    weight: float = 1.0
    pair: bool = False  # a node pair (through the fabric) rather than one port's own counters


@dataclass(slots=True)
class Cluster:
    element: str
    candidates: list[Candidate]
    symptoms: list[Symptom] = field(default_factory=list)
    # bad / (bad + good) votes of the element: 1.0 when every probed path through it is bad
    consistency: float = 1.0

    @property
    def pair_count(self) -> int:
        return sum(1 for s in self.symptoms if s.pair)


class Localizer:
    """Maps nodes, ports and pairs to element ids, and explains symptoms by voting."""

    def __init__(
        self, topology: Any = None, path_oracle: PathOracle | Mapping[tuple[str, str], Collection[str]] | None = None
    ) -> None:
        self.topology = topology
        self._oracle = _as_oracle(path_oracle)
        self._host_link: dict[str, str] = {}
        self._leaf: dict[str, str] = {}
        self._hcas: dict[str, list[str]] = {}
        self._uplinks: dict[str, list[str]] = {}
        self._paths: dict[tuple[str, str], tuple[frozenset[str], ...]] = {}
        if topology is not None:
            self._index(topology)

    def _index(self, topology: Any) -> None:
        for link in topology.links.values():
            if link.kind == "host":
                self._host_link[link.a] = link.id
                self._leaf[link.a] = link.b
                self._leaf[topology.hca_ports[link.a].node] = link.b
            elif link.kind == "fabric":
                self._uplinks.setdefault(link.a, []).append(link.id)
        for node, hcas in topology.nodes.items():
            self._hcas[node] = sorted(hcas, key=_device_order)

    # --- element ids ---------------------------------------------------------------------------

    def hca(self, node: str, device: str) -> str:
        return f"{node}/{device}"

    def host_link(self, hca: str) -> str:
        return self._host_link.get(hca, hca)

    def leaf(self, node_or_hca: str) -> str | None:
        return self._leaf.get(node_or_hca)

    def uplinks(self, leaf: str) -> list[str]:
        return sorted(self._uplinks.get(leaf, []))

    def hcas(self, node: str) -> list[str]:
        return self._hcas.get(node, [])

    # --- symptoms ------------------------------------------------------------------------------

    def port_symptom(self, ref: Any, hca: str, weight: float = 1.0) -> Symptom:
        node = hca.split("/", 1)[0]
        return Symptom(ref, (frozenset({hca, self.host_link(hca), node}),), weight)

    def pair_symptom(self, ref: Any, src: str, dst: str, weight: float = 1.0) -> Symptom:
        return Symptom(ref, self.pair_paths(src, dst), weight, pair=True)

    def pair_ports(self, src: str, dst: str) -> dict[str, float]:
        """The HCA ports a probe pair uses, each with the fraction of its path alternatives using it."""
        alts = self.pair_paths(src, dst)
        out: dict[str, float] = {}
        for alt in alts:
            for e in alt:
                if element_type(e) == "hca":
                    out[e] = out.get(e, 0.0) + 1.0 / len(alts)
        return out

    def crosses(self, src: str, dst: str, elements: Collection[str]) -> bool:
        """Whether every path alternative of the pair crosses one of ``elements``."""
        alts = self.pair_paths(src, dst)
        return bool(alts) and all(any(e in alt for e in elements) for alt in alts)

    def pair_paths(self, src: str, dst: str) -> tuple[frozenset[str], ...]:
        key = (src, dst)
        found = self._paths.get(key)
        if found is None:
            found = self._paths[key] = self._resolve(src, dst)
        return found

    def _resolve(self, src: str, dst: str) -> tuple[frozenset[str], ...]:
        ends = frozenset({src, dst})
        if self._oracle is not None:
            path = self._oracle(src, dst)
            if path is not None:
                return (ends | _with_switches(path),)
        if self.topology is not None and src in self._hcas and dst in self._hcas and src != dst:
            return tuple(self.topology.paths(src, dst))
        return (ends,)

    # --- voting --------------------------------------------------------------------------------

    def explain(
        self, bad: Sequence[Symptom], healthy: Iterable[Symptom] = (), *, min_share: float = 0.0
    ) -> list[Cluster]:
        """Greedy cover of ``bad`` by best-scoring elements; one cluster per chosen element."""
        remaining = list(bad)
        good = _votes(healthy)
        clusters: list[Cluster] = []
        while remaining:
            scores = _scores(remaining, good)
            if not scores:
                break
            ranked = sorted(scores.items(), key=lambda kv: (-round(kv[1], 9), _RANK[element_type(kv[0])], kv[0]))
            best = ranked[0][0]
            explained = [s for s in remaining if any(best in alt for alt in s.alternatives)]
            if ranked[0][1] < min_share and clusters:
                break
            top = [Candidate(e, round(v, 4)) for e, v in ranked[:TOP_CANDIDATES]]
            votes = _votes(remaining).get(best, 0.0)
            clusters.append(Cluster(best, top, explained, votes / (votes + good.get(best, 0.0)) if votes else 0.0))
            remaining = [s for s in remaining if s not in explained]
        return clusters


def _votes(symptoms: Iterable[Symptom]) -> dict[str, float]:
    votes: dict[str, float] = {}
    for s in symptoms:
        share = s.weight / len(s.alternatives) if s.alternatives else 0.0
        for alt in s.alternatives:
            for e in alt:
                votes[e] = votes.get(e, 0.0) + share
    return votes


def _scores(bad: Sequence[Symptom], good: Mapping[str, float]) -> dict[str, float]:
    votes = _votes(bad)
    total = sum(s.weight for s in bad) or 1.0
    return {e: (v / total) * (v / (v + good.get(e, 0.0))) for e, v in votes.items() if v > 0}


def _with_switches(path: Collection[str]) -> frozenset[str]:
    """A path given as links also crosses the switches at their ends and the HCA ports."""
    out = set(path)
    for link in path:
        if "~" in link:
            a, b = link.split("~", 1)
            out.update((a, b))
            if "/" in a:
                out.add(a.split("/", 1)[0])
    return frozenset(out)


def _as_oracle(oracle: PathOracle | Mapping[tuple[str, str], Collection[str]] | None) -> PathOracle | None:
    if oracle is None or callable(oracle):
        return oracle
    table = dict(oracle)
    return lambda src, dst: table.get((src, dst))


def _device_order(hca: str) -> tuple[int, str]:
    tail = hca.rsplit("_", 1)[-1]
    return (int(tail), hca) if tail.isdigit() else (1 << 30, hca)
