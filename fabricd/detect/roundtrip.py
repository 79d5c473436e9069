"""Round trips (docs/detection.md, "Round trips"): a probe's RTT and loss are its request's path and
its reply's, and a queue sits on one direction of a link (a switch port's egress). A path's links
become directed vote keys, ``<link>><the end it goes to>``, beside the links themselves."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fabricd.topology import Element, ElementKind

DIRECTED = ">"
# Round trips of a pair: request alternatives x reply alternatives, bounded (past it a reply keeps
# only the elements all its alternatives share, its certain part)
MAX_TRIPS = 64
_LINKS = (ElementKind.FABRIC_LINK, ElementKind.HOST_LINK)


def link_of(key: str) -> str:
    """The link a directed vote key stands for."""
    return key.rpartition(DIRECTED)[0]


def directed_keys(alt: frozenset[str], start: str, element: Callable[[str], Element | None]) -> frozenset[str]:
    """The links of one path as directed keys, walked from ``start`` (a node) along the chain the
    links make: its host link first, then each link with an end where the walk stands."""
    links: dict[str, tuple[str, ...]] = {}
    here = None
    for e in alt:
        found = element(e)
        if found is not None and found.kind in _LINKS and found.ends:
            links[e] = found.ends
            if found.kind is ElementKind.HOST_LINK and found.node == start and here is None:
                here = found.ends[0]  # the start's HCA port
    out = set()
    while here is not None and links:
        step = next(((link, ends) for link, ends in sorted(links.items()) if here in ends), None)
        if step is None:
            break
        link, ends = step
        del links[link]
        here = ends[-1] if here == ends[0] else ends[0]
        out.add(f"{link}{DIRECTED}{here}")
    return frozenset(out)


def combine(there: Sequence[frozenset[str]], back: Sequence[frozenset[str]]) -> tuple[frozenset[str], ...]:
    """Every request alternative with every reply alternative (each pairing equally likely)."""
    if len(there) * len(back) > MAX_TRIPS:
        back = [frozenset.intersection(*back)]
    return tuple(f | b for f in there for b in back)


def directed_views(switch: str, members: Sequence[str], element: Callable[[str], Element | None]) -> list[list[str]]:
    """``switch``'s links ``members`` as the traffic leaving the switch through them, and as the
    traffic entering it: a round trip crosses two of a leaf's uplinks, one each way, while a queue
    sits on one direction (the consistency of "one of a leaf's uplinks", ``votes.group_consistency``)."""
    ends = {m: found.ends if (found := element(m)) is not None else () for m in members}
    leaving = [f"{m}{DIRECTED}{next((e for e in ends[m] if e != switch), switch)}" for m in members]
    return [leaving, [f"{m}{DIRECTED}{switch}" for m in members]]
