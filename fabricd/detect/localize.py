"""Localization: the smallest topology element that explains a set of symptoms (docs/detection.md,
"Localization", "Round trips" and "Partial knowledge").

* a *pair* symptom (pingmesh loss or RTT between two nodes): the elements on the pair's round trip;
  exact where a path oracle knows the path (traceroute / ibtracert, the simulator's), else every
  ECMP alternative (``Topology.paths``), each element getting the fraction of alternatives holding it;
* a *port* symptom (the port's own counters): the HCA port, its host link and its node.

Scoring (007's votes with NetBouncer's "a healthy path clears its elements", ``votes.Tally``): the
share of the symptoms an element explains times how consistently its paths are bad. The best
element is taken, the symptoms it explains removed, the rest explained again (greedy set cover), so
two faults give two clusters; ties go to the smallest element. A switch that collected split ECMP
votes, reached only through its fabric links, is one of those links: the one that stands out
(``STANDS_OUT``), or the top ones, and the cluster says it is ``ambiguous`` among them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from fabricd.detect.roundtrip import combine, directed_keys, directed_views, link_of
from fabricd.detect.votes import (
    Cluster,
    Symptom,
    Tally,
    background_rate,
    below_is_noise,
    certain_votes,
    group_consistency,
    split_below,
    subject,
    ties,
    votes,
)
from fabricd.model import Candidate
from fabricd.topology import Element, ElementKind

__all__ = ["Cluster", "Localizer", "PathOracle", "Symptom"]

# Tie-break: smaller elements first (a link explains less than the switch it hangs off); an element
# the topology does not know ranks last.
_RANK = {
    ElementKind.FABRIC_LINK: 0,
    ElementKind.HOST_LINK: 1,
    ElementKind.HCA: 2,
    ElementKind.SWITCH: 3,
    ElementKind.NODE: 4,
    None: 5,
}
TOP_CANDIDATES = 5
# A fabric link is named alone when its score is at least twice the next one's: a symptom split over
# two alternatives gives each half the weight a known path gives, so a lead smaller than that can
# come from the split weights alone, not from paths that tell the links apart.
STANDS_OUT = 2.0
PathOracle = Callable[[str, str], Collection[str] | None]


class Localizer:
    """Maps nodes, ports and pairs to element ids, and explains symptoms by voting.

    Each element's kind (and the host it belongs to) is resolved from the topology, never read from
    the shape of its name (issue 15 §7): ``gpu-a17`` is a host and ``ib-leaf-3`` a switch because
    the topology says so. Without a topology, the only elements are the hosts and HCA ports this
    localizer was handed, and it remembers what each one is.
    """

    def __init__(
        self,
        topology: Any = None,
        path_oracle: PathOracle | Mapping[tuple[str, str], Collection[str]] | None = None,
        reply_oracle: PathOracle | Mapping[tuple[str, str], Collection[str]] | None = None,
    ) -> None:
        self.topology = topology
        self._oracle = _as_oracle(path_oracle)
        self._replies = _as_oracle(reply_oracle)  # dst back to src; None: replies retrace the way there
        self._trips: dict[tuple[str, str], tuple[tuple[frozenset[str], ...], frozenset[str]]] = {}
        self._link_of: dict[str, str] = {}  # directed vote key -> its link
        self._host_link: dict[str, str] = {}
        self._leaf: dict[str, str] = {}
        self._hcas: dict[str, list[str]] = {}
        self._uplinks: dict[str, list[str]] = {}
        self._fabric_links: dict[str, list[str]] = {}  # switch -> every fabric link at it
        self._paths: dict[tuple[str, str], tuple[frozenset[str], ...]] = {}
        self._reach: dict[tuple[str, str], frozenset[str]] = {}  # node pair -> every element it may cross
        self._ports: dict[tuple[str, str], dict[str, float]] = {}
        self._seen: dict[str, Element] = {}  # hosts and HCA ports handed in, absent from the topology
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
                for end in (link.a, link.b):
                    self._fabric_links.setdefault(end, []).append(link.id)
        for node, hcas in topology.nodes.items():
            self._hcas[node] = sorted(hcas, key=_device_order)

    # --- element ids ---------------------------------------------------------------------------

    def hca(self, node: str, device: str) -> str:
        hca_id = f"{node}/{device}"
        if self.element(hca_id) is None:
            self._seen[hca_id] = Element(hca_id, ElementKind.HCA, node, device)
        return hca_id

    def element(self, element_id: str) -> Element | None:
        """The element with its kind, from the topology (or as handed in); None when unknown."""
        found = self.topology.element(element_id) if self.topology is not None else None
        return found if found is not None else self._seen.get(element_id)

    def kind(self, element_id: str) -> ElementKind | None:
        found = self.element(element_id)
        return found.kind if found is not None else None

    def node_of(self, element_id: str) -> str | None:
        """The host of a node, an HCA port or a host link; None for switches, fabric links and unknowns."""
        found = self.element(element_id)
        return found.node or None if found is not None else None

    def _node(self, node: str) -> str:
        if self.element(node) is None:
            self._seen[node] = Element(node, ElementKind.NODE, node)
        return node

    def host_link(self, hca: str) -> str:
        return self._host_link.get(hca, hca)

    def leaf(self, node_or_hca: str) -> str | None:
        return self._leaf.get(node_or_hca)

    def fabric_links(self, switch: str) -> list[str]:
        """Every fabric link with an end at ``switch`` (none for an element that is no switch)."""
        return sorted(self._fabric_links.get(switch, []))

    def uplinks(self, leaf: str) -> list[str]:
        return sorted(self._uplinks.get(leaf, []))

    def hcas(self, node: str) -> list[str]:
        return self._hcas.get(node, [])

    # --- symptoms ------------------------------------------------------------------------------

    def port_symptom(self, ref: Any, hca: str, weight: float = 1.0) -> Symptom:
        found = self.element(hca)
        node = found.node if found is not None and found.node else hca
        return Symptom(ref, (frozenset({hca, self.host_link(hca), node}),), weight)

    def pair_symptom(self, ref: Any, src: str, dst: str, weight: float = 1.0) -> Symptom:
        """A probe pair's symptom: its round trips (a probe's RTT and its loss are the request's
        path and the reply's), each with the links' directions when replies take paths of their own."""
        trips, common = self.round_trip(self._node(src), self._node(dst))
        return Symptom(ref, trips, weight, pair=True, common=common)

    def round_trip(self, src: str, dst: str) -> tuple[tuple[frozenset[str], ...], frozenset[str]]:
        """The pair's round-trip alternatives (request x reply) and the elements all of them hold
        (cached: a new topology or new routes make a new localizer)."""
        key = (src, dst)
        found = self._trips.get(key)
        if found is None:
            trips = self._round_trips(src, dst)
            common = frozenset.intersection(*trips) if trips else frozenset()
            found = self._trips[key] = (trips, common)
        return found

    def _round_trips(self, src: str, dst: str) -> tuple[frozenset[str], ...]:
        forward = self.pair_paths(src, dst)
        if self._replies is None or not forward:
            return forward  # symmetric: the reply crosses the same links, both ways, as one element each
        there = [alt | self._directed(alt, src) for alt in forward]
        back = [alt | self._directed(alt, dst) for alt in self._reply_paths(src, dst)]
        return combine(there, back)

    def _directed(self, alt: frozenset[str], start: str) -> frozenset[str]:
        keys = directed_keys(alt, start, self.element)
        for key in keys:
            self._link_of[key] = link_of(key)
        return keys

    def _reply_paths(self, src: str, dst: str) -> tuple[frozenset[str], ...]:
        """Where the replies to src's probes go, from dst back to src: as told (a traced reply, an
        uploaded one, InfiniBand's route from dst to src), else every ECMP alternative."""
        path = self._replies(src, dst) if self._replies is not None else None
        if path is not None:
            return (frozenset({src, dst}) | self._with_ends(path),)
        if self.topology is not None and src in self._hcas and dst in self._hcas and src != dst:
            return tuple(self.topology.paths(dst, src))
        return (frozenset({src, dst}),)

    def pair_ports(self, src: str, dst: str) -> dict[str, float]:
        """The HCA ports a probe pair uses, each with the fraction of its path alternatives using it
        (cached: paths change only with the topology, which makes a new localizer)."""
        key = (src, dst)
        cached = self._ports.get(key)
        if cached is not None:
            return cached
        out = self._ports[key] = self._pair_ports(src, dst)
        return out

    def _pair_ports(self, src: str, dst: str) -> dict[str, float]:
        alts = self.pair_paths(src, dst)
        out: dict[str, float] = {}
        for alt in alts:
            for e in alt:
                if self.kind(e) is ElementKind.HCA:
                    out[e] = out.get(e, 0.0) + 1.0 / len(alts)
        return out

    def crosses(self, src: str, dst: str, elements: Collection[str]) -> bool:
        """Whether every round trip of the pair crosses one of ``elements``."""
        alts = self.round_trip(src, dst)[0]
        return bool(alts) and all(any(e in alt for e in elements) for alt in alts)

    def may_cross(self, src: str, dst: str, elements: Collection[str]) -> bool:
        """Whether traffic between two nodes may cross one of ``elements``: any ECMP alternative of
        the topology (a job's flows hash over all of them, whatever route the probes took)."""
        if self.topology is None or src not in self._hcas or dst not in self._hcas or src == dst:
            return bool({src, dst} & set(elements))
        if (reach := self._reach.get((src, dst))) is None:  # NCCL runs ask for the same pairs each time
            reach = self._reach[(src, dst)] = frozenset().union(*self.topology.paths(src, dst))
        return any(e in reach for e in elements)

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
                return (ends | self._with_ends(path),)
        if self.topology is not None and src in self._hcas and dst in self._hcas and src != dst:
            return tuple(self.topology.paths(src, dst))
        return (ends,)

    # --- voting --------------------------------------------------------------------------------

    def explain(
        self, bad: Sequence[Symptom], healthy: Iterable[Symptom] = (), *, min_share: float = 0.0
    ) -> list[Cluster]:
        """Greedy cover of ``bad`` by best-scoring elements; one cluster per chosen element."""
        remaining = list(bad)
        fine = list(healthy)
        good, good_certain = votes(fine), certain_votes(fine)
        clusters: list[Cluster] = []
        while remaining:
            tally = Tally(votes(remaining), good, certain_votes(remaining), good_certain, remaining, fine)
            scores, keys = self._scores(tally)
            if not scores:
                break
            ranked = sorted(scores.items(), key=lambda kv: (-round(kv[1], 9), _RANK[self.kind(kv[0])], kv[0]))
            if ranked[0][1] < min_share and clusters:
                break
            cluster = self._ecmp_cluster(ranked[0][0], scores, remaining, tally, keys) or self._cluster(
                ranked, remaining, tally, keys
            )
            clusters.append(cluster)
            remaining = [s for s in remaining if s not in cluster.symptoms]
        return clusters

    def _scores(self, tally: Tally) -> tuple[dict[str, float], dict[str, str]]:
        """Each element's score; a link's is that of the direction (or both) its evidence fits best,
        and ``keys`` says which vote key that was. Directed keys exist only when replies take paths
        of their own (``_directed``): a queue on one direction of a link delays the pairs whose
        request or reply leaves through it, and pairs crossing it the other way say nothing of it."""
        scores: dict[str, float] = {}
        keys: dict[str, str] = {}
        best: dict[str, tuple[float, int]] = {}
        for key, v in tally.bad.items():
            if v <= 0:
                continue
            element = self._link_of.get(key, key)
            rank = (round(tally.score(key), 9), int(key == element))  # a tie keeps the link itself
            if element not in best or rank > best[element]:
                best[element], keys[element], scores[element] = rank, key, tally.score(key)
        return scores, keys

    def _cluster(
        self, ranked: list[tuple[str, float]], remaining: list[Symptom], tally: Tally, keys: Mapping[str, str]
    ) -> Cluster:
        """The best element's cluster; ambiguous when others of its kind tie with it (the tie-break
        by name would pick one silently: two links every bad path crosses together)."""
        best, lead = ranked[0]
        key = keys.get(best, best)
        explained = [s for s in remaining if any(key in alt for alt in s.alternatives)]
        bad_votes = tally.bad
        rank = _RANK[self.kind(best)]
        tied = [e for e, v in ranked if ties(v, lead) and _RANK[self.kind(e)] == rank]
        # A tie is ambiguity only between elements on the same symptoms' paths: two host links
        # scoring alike from two ports' own marks are two places, not "one of" them.
        tied = [e for e in tied if all(any(keys.get(e, e) in alt for alt in s.alternatives) for s in explained)]
        if len(tied) > 1:
            group = sum(bad_votes.get(keys.get(e, e), 0.0) for e in tied) or 1.0
            top = [Candidate(e, round(lead, 4), round(bad_votes.get(keys.get(e, e), 0.0) / group, 4)) for e in tied]
        else:
            top = [
                Candidate(e, round(v, 4), round(bad_votes.get(keys.get(e, e), 0.0) / tally.total, 4))
                for e, v in ranked[:TOP_CANDIDATES]
            ]
        subject = self._subject(best, tied) if len(tied) > 1 else ""
        return Cluster(best, top, explained, tally.consistency(key), self.kind(best), len(tied) > 1, subject)

    def _ecmp_cluster(
        self, best: str, scores: Mapping[str, float], remaining: list[Symptom], tally: Tally, keys: Mapping[str, str]
    ) -> Cluster | None:
        """The cluster of a switch that collected split votes, placed on its fabric links (see the
        module's docstring); None when the symptoms do not reach it through them alone."""
        if self.kind(best) is not ElementKind.SWITCH:
            return None
        explained = [s for s in remaining if any(best in alt for alt in s.alternatives)]
        if not any(len(s.alternatives) > 1 for s in explained):
            return None  # every path known: the switch itself is what they share
        tied = [e for e, v in scores.items() if self.kind(e) is ElementKind.SWITCH and ties(v, scores[best])]
        groups = [(sw, links) for sw in sorted(tied) if (links := self._top_links(sw, scores, remaining, tally))]
        if not groups or groups[0][0] != best:
            return None
        tops = {sw: max(scores[link] for link in links) for sw, links in groups}
        lead = max(tops.values())
        members = sorted({m for sw, links in groups if ties(tops[sw], lead) for m in links})
        if len(groups[0][1]) == 1 or len(members) == 1:  # one link stands out: the paths told them apart
            link = groups[0][1][0] if len(groups[0][1]) == 1 else members[0]
            ranked = sorted(scores.items(), key=lambda kv: (-round(kv[1], 9), _RANK[self.kind(kv[0])], kv[0]))
            ranked.insert(0, ranked.pop(next(i for i, (e, _) in enumerate(ranked) if e == link)))
            return self._cluster(ranked, remaining, tally, keys)
        return self._ambiguous(best, members, remaining, tally)

    def _top_links(self, switch: str, scores: Mapping[str, float], remaining: list[Symptom], tally: Tally) -> list[str]:
        """The switch's fabric links within STANDS_OUT of its best one; [] when a bad symptom
        reaches the switch without crossing one of its fabric links (a fault below it), unless
        those symptoms are noise beside the ones through the links (``votes.below_is_noise``)."""
        links = set(self._fabric_links.get(switch, []))
        if not links:
            return []
        below, over = split_below(switch, links, remaining)
        if below:
            background = background_rate(switch, links, remaining, tally.healthy)
            if not below_is_noise(below, over, split_below(switch, links, tally.healthy), background):
                return []
        voted = sorted((scores[link], link) for link in links if scores.get(link, 0.0) > 0)
        if not voted:
            return []
        lead = voted[-1][0]
        return sorted(link for v, link in voted if v * STANDS_OUT > lead or ties(v, lead))

    def _ambiguous(self, switch: str, members: list[str], remaining: list[Symptom], tally: Tally) -> Cluster:
        """One of ``members``: each weighted by its share of the evidence; consistency as if one
        of them carried every bad symptom, over the probed traffic one of them carries."""
        group = set(members)
        explained = [s for s in remaining if any(group & alt for alt in s.alternatives)]
        bad = votes(explained)
        total = sum(bad.get(m, 0.0) for m in members) or 1.0
        scores = self._scores(tally)[0]
        candidates = [Candidate(m, round(scores.get(m, 0.0), 4), round(bad.get(m, 0.0) / total, 4)) for m in members]
        carried = votes(explained)
        for e, v in tally.good.items():
            carried[e] = carried.get(e, 0.0) + v
        views = [members, *(directed_views(switch, members, self.element) if self._link_of else [])]
        consistency = max(group_consistency(view, explained, carried) for view in views)
        return Cluster(
            switch, candidates, explained, consistency, ElementKind.SWITCH, True, self._subject(switch, members)
        )

    def _subject(self, element: str, members: list[str]) -> str:
        tier = self.topology.switches[element].tier if self.topology and element in self.topology.switches else ""
        uplinks = tier == "leaf" and set(members) <= set(self._fabric_links.get(element, []))
        return subject(element, members, uplinks, [self.kind(m) for m in members])

    def _with_ends(self, path: Collection[str]) -> frozenset[str]:
        """A path given as links also crosses the elements at their ends (switches, HCA ports) and
        the hosts of those HCA ports, as the topology has them."""
        out = set(path)
        for element_id in path:
            found = self.element(element_id)
            if found is not None and found.ends:
                out.update(found.ends)
                if found.node:
                    out.add(found.node)
        return frozenset(out)


def _as_oracle(oracle: PathOracle | Mapping[tuple[str, str], Collection[str]] | None) -> PathOracle | None:
    if oracle is None or callable(oracle):
        return oracle
    table = dict(oracle)
    return lambda src, dst: table.get((src, dst))


def _device_order(hca: str) -> tuple[int, str]:
    tail = hca.rsplit("_", 1)[-1]
    return (int(tail), hca) if tail.isdigit() else (1 << 30, hca)
