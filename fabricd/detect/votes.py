"""Votes of the localizer (``fabricd.detect.localize``): the symptoms it explains, the clusters it
returns, and the tally of bad and good votes an element's score comes from (docs/detection.md,
"Localization" and "Round trips")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from fabricd.model import Candidate
from fabricd.topology import ElementKind

TIE = 1e-9


@dataclass(frozen=True, slots=True)
class Symptom:
    """Something observed bad (or, in ``healthy``, observed fine) and where it could come from."""

    ref: Any  # what the caller wants back (a finding, a pair)
    alternatives: tuple[frozenset[str], ...]
    weight: float = 1.0
    pair: bool = False  # a node pair (through the fabric) rather than one port's own counters
    # the elements every alternative holds: where the symptom certainly went (None: work it out)
    common: frozenset[str] | None = None

    def certain(self) -> frozenset[str]:
        if self.common is not None:
            return self.common
        return frozenset.intersection(*self.alternatives) if self.alternatives else frozenset()


@dataclass(slots=True)
class Cluster:
    element: str
    candidates: list[Candidate]
    symptoms: list[Symptom] = field(default_factory=list)
    # bad / (bad + good) votes of the element: 1.0 when every probed path through it is bad
    consistency: float = 1.0
    kind: ElementKind | None = None  # from the topology (None: an element it does not know)
    # the evidence cannot tell ``candidates`` apart; ``element`` is the switch they hang off
    ambiguous: bool = False
    subject: str = ""  # how the summary names it: "one of leaf-02's 4 uplinks (...)"

    @property
    def pair_count(self) -> int:
        return sum(1 for s in self.symptoms if s.pair)


def votes(symptoms: Iterable[Symptom]) -> dict[str, float]:
    """Each element's votes: a symptom's weight, split evenly over its alternatives."""
    out: dict[str, float] = {}
    for s in symptoms:
        part = s.weight / len(s.alternatives) if s.alternatives else 0.0
        for alt in s.alternatives:
            for e in alt:
                out[e] = out.get(e, 0.0) + part
    return out


def certain_votes(symptoms: Iterable[Symptom]) -> dict[str, float]:
    """Votes where the symptom's path is known: the elements every alternative holds."""
    out: dict[str, float] = {}
    for s in symptoms:
        for e in s.certain():
            out[e] = out.get(e, 0.0) + s.weight
    return out


class Tally:
    """One step's votes. An element's consistency is its bad votes over bad and good; where some
    symptom certainly crossed it (its path known), only healthy pairs that certainly crossed it
    clear it: a healthy pair that merely may have crossed it (an untraced reply, an ECMP
    alternative) most likely took another way, as the pairs known to be bad through it say. With
    every path known this is bad / (bad + good), as before; with none, the same over shares."""

    __slots__ = ("bad", "bad_certain", "good", "good_certain", "healthy", "total")

    def __init__(
        self,
        bad: dict[str, float],
        good: Mapping[str, float],
        bad_certain: Mapping[str, float],
        good_certain: Mapping[str, float],
        symptoms: Sequence[Symptom],
        healthy: Sequence[Symptom] = (),
    ) -> None:
        self.bad, self.good, self.bad_certain, self.good_certain = bad, good, bad_certain, good_certain
        self.healthy = healthy  # the symptoms observed fine, which ``good`` counts
        self.total = sum(s.weight for s in symptoms) or 1.0

    def consistency(self, key: str) -> float:
        v = self.bad.get(key, 0.0)
        if not v:
            return 0.0
        against = self.good_certain if self.bad_certain.get(key, 0.0) > 0 else self.good
        return v / (v + against.get(key, 0.0))

    def score(self, key: str) -> float:
        """The share of the symptoms it explains times how consistently its paths are bad."""
        return self.bad.get(key, 0.0) / self.total * self.consistency(key)


def share(s: Symptom, group: set[str]) -> float:
    """The fraction of a symptom's alternatives crossing one of ``group``."""
    return sum(1 for alt in s.alternatives if group & alt) / len(s.alternatives) if s.alternatives else 0.0


def ties(a: float, b: float) -> bool:
    return abs(a - b) <= TIE * max(abs(a), abs(b), 1.0)


def group_consistency(view: Sequence[str], explained: Sequence[Symptom], carried: Mapping[str, float]) -> float:
    """Consistency of "one of ``view``": as if one of them carried every bad symptom, over the
    probed traffic one of them carries (one bad link among n sees 1/n of the pairs through them)."""
    load = sum(carried.get(m, 0.0) for m in view) / len(view)
    crossing = sum(s.weight * share(s, set(view)) for s in explained)
    return min(1.0, crossing / load) if load else 0.0


# A pair below a switch is noise beside its uplinks' pairs when its weight is at most this share of
# theirs (the median): one standing queue delays every probe through it by about the same time, so
# the pairs behind it all score alike, and a fault below the switch would slow the pairs there as
# much. Weights are 1 + decades over the threshold (base.severity_weights): against pairs 1,000x
# over it, a pair below is noise while at most 10x over. Measured in the routed lab: RTT noise flags
# 30-50 of its 132 pairs at 6-40 robust sigmas (1-7x the threshold) at any time, the queue's pairs
# score in the thousands; with a strict veto one noisy pair below the leaf hid the leaf's uplinks.
# Only a minority may be set aside this way: several pairs below the switch are a fault there.
NOISE_WEIGHT_SHARE = 0.5
# Pairs below a switch are noise, too, when a far smaller share of the probed pairs below it are bad
# than of those through its fabric links, however strong each is: a fault in the switch itself (its
# buffers, its ASIC) hits the pairs it switches locally as often as those it sends up, and one on its
# fabric links hits only the latter. Loss has no strength to tell (every lossy pair weighs 1): in a
# CI run of the routed lab, its 2 cores saturated, 2 of the 12 pairs below the lossy leaf lost a
# probe or two a minute (and 7 of the 24 below the other leaves), against 42 of its 64 pairs through
# its uplinks, and the leaf was named as a whole. Half: a faulty switch's share is usually near all
# of its pairs on both sides; at a 50 % share, 3 or fewer of the 12 pairs below a leaf are bad 7 % of
# the time (binomial), and then the leaf is still named, as "one of its uplinks".
NOISE_RATE_SHARE = 0.5
# And they are noise when no more of them are bad than of the probed pairs that reach neither the
# switch nor its links: that share is the fabric's background (a busy host answering past the probe
# timeout, a lossy link elsewhere), which a fault in the switch would rise above. In a later CI run
# of the routed lab a sixth of the bad pairs' votes lay away from the lossy leaf, and the leaf was
# named as a whole again (how many pairs below it lost is not in the log: it prints candidates).


def split_below(switch: str, links: Set[str], symptoms: Iterable[Symptom]) -> tuple[list[Symptom], list[Symptom]]:
    """The symptoms reaching ``switch`` without crossing one of its fabric ``links`` on every
    alternative (below it), and those that do (over it)."""
    below: list[Symptom] = []
    over: list[Symptom] = []
    for s in symptoms:
        if any(switch in alt for alt in s.alternatives):
            (over if all(not links.isdisjoint(alt) for alt in s.alternatives) else below).append(s)
    return below, over


def below_is_noise(
    below: Sequence[Symptom],
    over: Sequence[Symptom],
    fine: tuple[Sequence[Symptom], Sequence[Symptom]],
    background: float = 0.0,
) -> bool:
    """Whether the bad symptoms below a switch are noise beside those through its fabric links:
    far weaker (``NOISE_WEIGHT_SHARE``), far rarer among the probed pairs (``NOISE_RATE_SHARE``;
    ``fine``: the healthy symptoms below and over, as ``split_below`` gives them), or no more
    frequent than the ``background`` share of bad pairs elsewhere (``background_rate``)."""
    if not over or len(below) * 2 >= len(over):
        return False
    weights = sorted(s.weight for s in over)
    typical = weights[len(weights) // 2]
    if all(s.weight <= NOISE_WEIGHT_SHARE * typical for s in below):
        return True
    rate_below = len(below) / (len(below) + len(fine[0]))
    rate_over = len(over) / (len(over) + len(fine[1]))
    return rate_below <= max(NOISE_RATE_SHARE * rate_over, background)


def background_rate(switch: str, links: Set[str], bad: Iterable[Symptom], healthy: Iterable[Symptom]) -> float:
    """The share of bad pairs among the probed pairs whose every alternative misses ``switch`` and
    its fabric ``links`` (0.0 when there are none)."""

    def away(s: Symptom) -> bool:
        return s.pair and all(switch not in alt and links.isdisjoint(alt) for alt in s.alternatives)

    n_bad = sum(1 for s in bad if away(s))
    n_fine = sum(1 for s in healthy if away(s))
    return n_bad / (n_bad + n_fine) if n_bad + n_fine else 0.0


_NOUNS: dict[ElementKind | None, str] = {
    ElementKind.FABRIC_LINK: "fabric links",
    ElementKind.HOST_LINK: "host links",
    ElementKind.HCA: "HCA ports",
    ElementKind.SWITCH: "switches",
    ElementKind.NODE: "nodes",
}


def subject(element: str, members: Sequence[str], uplinks: bool, kinds: Sequence[ElementKind | None]) -> str:
    """How a summary names an ambiguous cluster: "one of leaf-02's 4 uplinks (a, b, c, d)" when the
    members are ``element``'s uplinks, else "one of 2 fabric links (a, b)"."""
    listed = ", ".join(members)
    if uplinks:
        return f"one of {element}'s {len(members)} uplinks ({listed})"
    found = set(kinds)
    noun = _NOUNS.get(found.pop(), "elements") if len(found) == 1 else "elements"
    return f"one of {len(members)} {noun} ({listed})"
