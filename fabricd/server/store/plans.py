"""How points read from the stream become ``Delivery`` values for the detection loop.

The tail's batches (``stream._Tail``) and points read back from the database both end here: point
by point (``deliveries``, a ``Sample`` per kept point), or through each node's ``Plan`` as its
stored rows (``planned``, ``read_back``: docs/storage.md, "Detection reads a plan per node" and
"Rows read back go through the node's plan"). Kept apart from ``stream.py``, which reads and
holds the points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import compress, groupby
from operator import itemgetter
from typing import Any, NamedTuple, cast

from fabricd.model import Reading, Sample, Status
from fabricd.scrape_rows import STATUSES, Layout, ScrapeRows
from fabricd.server.store.identities import Identity
from fabricd.server.store.records import KEEP_MAX, SHARE, Delivery, Keep, PointRow

_SID, _TS = itemgetter(0), itemgetter(1)
_OWNER, _READING, _HOW = itemgetter(0), itemgetter(1), itemgetter(2)  # of a ``Keep`` entry (an identity: two)
LAYOUTS_MAX = 256  # shared layouts a reader keeps: a fleet has a few batch shapes, a read's cuts a few more


class Chunk(NamedTuple):
    """One batch's points as the tail keeps them (all of them, or the part a read took)."""

    node: str  # as the writer named it
    rows: Sequence[PointRow]
    sids: tuple[int, ...]  # the rows' series ids, in order (the writer's: ``Committed.sids``)
    ts: float | None  # the event time of every row, when the batch is one scrape (None: unknown)


def deliveries(rows: Sequence[Any], idents: Mapping[int, Identity], keep: Keep | None = None) -> list[Delivery]:
    """The ``(series id, ts, value, rate, status, since)`` rows as samples, one ``Delivery`` per run
    of consecutive rows of one node; with ``keep``, only the samples of the series it keeps (and,
    if it reads rates only, a counter's with its identity as reading: ``Keep``)."""
    keep = keep if keep is not None else Keep(None)
    out: list[Delivery] = []
    samples: list[Sample] = []
    stamps: list[float] = []
    node, last, start = None, 0.0, 0
    statuses, known, learn = STATUSES, keep.known, keep.learn
    for i, (sid, ts, value, rate, status, since) in enumerate(rows):
        seen = known.get(sid)
        if seen is None:
            seen = learn(sid, idents)
            if seen is None:  # a point of a series that does not exist (no foreign key): an inner join
                continue
        owner, b, how = seen
        if owner != node:
            if node is not None:
                out.append(Delivery(node, samples, i - start, stamps))
            node, samples, stamps, last, start = owner, [], [ts], ts, i
        elif ts != last:
            stamps.append(ts)
            last = ts
        if how == SHARE:
            samples.append(Sample(ts, b, rate, statuses.get(status) or Status(status), since))
        elif how:
            r = Reading(b.source, b.device, b.port, b.counter, value, b.unit, b.kind, b.labels, b.name)
            samples.append(Sample(ts, r, rate, statuses.get(status) or Status(status), since))
    if node is not None:
        out.append(Delivery(node, samples, len(rows) - start, stamps))
    return out


def read_back(rows: Sequence[PointRow], idents: Mapping[int, Identity], keep: Keep | None) -> list[Delivery]:
    """``deliveries`` of points read back from the database in id order, through each node's
    ``Plan`` as the tail's batches go (``planned``): the rows are cut where the node or the event
    time changes, one node's scrape a run. A reader behind the tail, and the correlator reading its
    partitions (``fabricd/server/partition_stream.py``), then hand the detectors stored rows
    instead of a sample built per kept point. Without ``keep``, or with a point of a series that
    does not exist (left out, as by an inner join), point by point."""
    runs = _runs(rows, idents, keep) if keep is not None and rows else None
    return planned(runs, idents, keep) if runs is not None and keep is not None else deliveries(rows, idents, keep)


def _runs(rows: Sequence[PointRow], idents: Mapping[int, Identity], keep: Keep) -> list[Chunk] | None:
    """The rows as ``Chunk`` runs of one node and one event time; None if a series is unknown."""
    known, learn = keep.known, keep.learn
    out: list[Chunk] = []
    start, node, ts = 0, "", rows[0][1]
    for i, row in enumerate(rows):
        seen = known.get(row[0]) or learn(row[0], idents)
        if seen is None:
            return None
        if seen[0] != node or row[1] != ts:
            if i:
                out.append(_run(node, rows[start:i], ts))
            start, node, ts = i, seen[0], row[1]
    out.append(_run(node, rows[start:], ts))
    return out


def _run(node: str, rows: Sequence[PointRow], ts: float) -> Chunk:
    return Chunk(node, rows, tuple(map(_SID, rows)), ts)


class Plan(NamedTuple):
    """How a reader reads one node's batch of these series, in this order: which rows it keeps,
    each with its identity and how (``Keep``). A node's agent sends the same series in the same
    order scrape after scrape, so the plan is made once and the rows left out are never looked at."""

    sids: tuple[int, ...]
    owner: str
    layout: Layout


def planned(chunks: Sequence[Chunk], idents: Mapping[int, Identity], keep: Keep) -> list[Delivery]:
    """``deliveries`` of the tail's batches, through each node's ``Plan``: the same samples and
    deliveries, without a lookup for every point (two thirds of a scrape is left out by the
    detection loop's ``Keep``: docs/storage.md, "Detection reads a plan per node"). A batch of one
    scrape is handed on as its rows (``ScrapeRows``): no sample is built unless a consumer asks."""
    out: list[Delivery] = []
    plans = keep.plans
    for node, rows, sids, one_ts in chunks:
        plan = plans.get(node)
        if plan is None or plan.sids != sids:
            held, plan = plan, _plan(sids, idents, keep)
            if plan is None:  # series of several nodes, or one that does not exist: point by point
                for d in deliveries(rows, idents, keep):
                    _join(out, d)
                continue
            if len(plans) >= KEEP_MAX:
                plans.clear()
            if held is None or not _part_of(sids, held.sids):  # a read's first or last batch, cut
                plans[node] = plan
        stamps = [one_ts] if one_ts is not None else [ts for ts, _ in groupby(map(_TS, rows))]
        samples = ScrapeRows(plan.layout, rows, stamps[0]) if len(stamps) == 1 else _samples(plan.layout, rows)
        _join(out, Delivery(plan.owner, samples, len(rows), stamps))
    return out


def _plan(sids: tuple[int, ...], idents: Mapping[int, Identity], keep: Keep) -> Plan | None:
    """The node's plan for a batch of ``sids``; None if they are not all of one node's series
    that exist.

    A fleet's nodes send the same series, and ``Identities`` gives each distinct identity one
    ``Reading``: the readings' ids key a layout made once (``Keep.how`` a series) and shared by
    every node whose batches have those series in that order, so the detectors also compile one
    program for them (``fabricd.detect.absorb.Programs``). A node's first batch is learned in
    bulk (``_learned``): one by one, and a layout a node, that was 10 % of the central's GIL time
    over a fleet's first scrape (py-spy, 1,000 nodes of 480 series, 2026-12-06)."""
    found = list(map(keep.known.get, sids))
    if None in found:
        return _learned(sids, idents, keep)
    entries = cast(list[tuple[str, Reading, int]], found)
    owners = set(map(_OWNER, entries))
    if len(owners) != 1:
        return None
    return Plan(sids, owners.pop(), _shared(tuple(map(_READING, entries)), keep).layout)


def _learned(sids: tuple[int, ...], idents: Mapping[int, Identity], keep: Keep) -> Plan | None:
    """``_plan`` of a batch with series the reader has not seen yet (a node's first scrape):
    each learned in C, as ``Keep.learn`` would."""
    loaded = getattr(idents, "loaded", None)  # ``stream._Unknown``: its mapping, once fetched
    found = list(map((loaded() if loaded is not None else idents).get, sids))
    if None in found:  # a series that does not exist: point by point (``deliveries``)
        return None
    readings = tuple(map(_READING, found))
    shared = _shared(readings, keep)
    known = keep.known
    if len(known) + len(sids) > KEEP_MAX:
        known.clear()
    owners = list(map(_OWNER, found))
    known.update(zip(sids, zip(owners, readings, shared.hows, strict=True), strict=True))
    if len(set(owners)) != 1:
        return None
    return Plan(sids, owners[0], shared.layout)


def _shared(readings: tuple[Reading, ...], keep: Keep) -> Shared:
    """The layout of a batch whose series have ``readings``, made once for all such batches."""
    # Ids are unique among live objects, and a ``Shared`` holds its readings: a key found is theirs.
    key = tuple(map(id, readings))
    shared = keep.layouts.get(key)
    if shared is None:
        if len(keep.layouts) >= LAYOUTS_MAX:
            keep.layouts.clear()
        hows = tuple(map(keep.how, readings))
        shared = keep.layouts[key] = Shared(readings, hows, _layout(readings, hows))
    return shared


class Shared(NamedTuple):
    """A layout shared by the batches whose series have these identities (``_learned``)."""

    readings: tuple[Reading, ...]  # held, so that no other reading takes their ids
    hows: tuple[int, ...]
    layout: Layout


def _layout(readings: tuple[Reading, ...], hows: tuple[int, ...]) -> Layout:
    """The rows kept (a ``how`` not SKIP), each with its identity and how, in C."""
    kept = tuple(compress(range(len(hows)), hows))
    return Layout(kept, tuple(zip(compress(readings, hows), compress(hows, hows), strict=True)))


def _part_of(sids: tuple[int, ...], whole: tuple[int, ...]) -> bool:
    """Whether ``sids`` are the first or the last part of ``whole``: a batch a read cut (a read
    takes at most ``limit`` points), whose plan must not replace the whole batch's."""
    n = len(sids)
    return n < len(whole) and (whole[:n] == sids or whole[-n:] == sids)


def _samples(layout: Layout, rows: Sequence[PointRow]) -> list[Sample]:
    return ScrapeRows(layout, rows, 0.0).samples()  # several scrapes: the samples carry their own times


def _join(out: list[Delivery], d: Delivery) -> None:
    """Append ``d``, as one delivery with the last when it is the same node's (a run of its rows)."""
    if not out or out[-1].node != d.node:
        out.append(d)
        return
    last = out[-1]
    samples = last.samples if isinstance(last.samples, list) else list(last.samples)
    samples.extend(d.samples)
    stamps = list(last.stamps or ())
    stamps.extend(d.stamps[1:] if stamps and d.stamps and d.stamps[0] == stamps[-1] else (d.stamps or ()))
    out[-1] = last._replace(samples=samples, rows=last.read + d.read, stamps=stamps)
