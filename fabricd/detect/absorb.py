"""The engine's intake of one scrape held as stored rows (``fabricd.scrape_rows.ScrapeRows``).

``DetectionEngine._absorb`` takes a scrape sample by sample: for each, the source's wanted names,
the metric, the kind, whether the device or the port changed, then the value into the scope. For a
batch read from the store every one of those answers is the same scrape after scrape: they depend
on the series, in their order, and the reader hands the same ``Layout`` for the same batch shape.
So they are worked out once per layout into a ``Program`` (the records, the scopes, and for each
kept row its metric and which column to take), and a scrape is then only its values put into the
scopes (docs/storage.md, "Detection reads stored rows"). The result is the same state as
``_absorb`` on the scrape's samples, in the same order (a repeat's last value wins); the tests
compare the two.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from fabricd.model import Kind, Labels
from fabricd.scrape_rows import RATE, VALUE, Layout, ScrapeRows

# The values of one (port, labels) scope: (row index, metric, column) for each kept row.
Scope = tuple[tuple[str, Labels], tuple[tuple[int, str, int], ...]]


class _Record(Protocol):
    scopes: dict[tuple[str, Labels], dict[str, float]]


RecordOf = Callable[[str, str, str, float], _Record]  # (node, source, device, ts) -> its record
RunHost = Callable[[str, float, Labels], None]  # (node, ts, labels)


class Program(NamedTuple):
    """What a scrape of one layout does to the engine: run hosts seen, then each run of rows of one
    (source, device) with its scopes, in the rows' order."""

    hosts: tuple[Labels, ...]
    records: tuple[tuple[str, str, tuple[Scope, ...]], ...]


def compile_layout(layout: Layout, wanted: Mapping[str, Collection[str]], run_host: str) -> Program:
    """The ``Program`` of ``layout`` for an engine reading ``wanted`` (``signals.WANTED``): the
    choices ``DetectionEngine._absorb`` makes for each sample, made once."""
    hosts: list[Labels] = []
    records: list[tuple[str, str, list[Scope]]] = []
    items: list[tuple[int, str, int]] = []
    counter, info, event = Kind.COUNTER, Kind.INFO, Kind.EVENT  # an enum member's lookup costs a call
    for i, (b, _how) in zip(layout.kept, layout.entries, strict=True):
        names = wanted.get(b.source)
        if names is None:
            continue
        metric, kind = b.name or b.counter, b.kind
        if metric not in names or kind is info or kind is event:
            if metric == run_host:
                hosts.append(b.labels)
            continue
        if not records or records[-1][:2] != (b.source, b.device):
            records.append((b.source, b.device, []))
        scopes = records[-1][2]
        where = (b.port, b.labels)
        if not scopes or scopes[-1][0] != where:
            items = []
            scopes.append((where, items))  # type: ignore[arg-type]  # frozen below
        items.append((i, metric, RATE if kind is counter else VALUE))
    return Program(
        tuple(hosts),
        tuple((src, dev, tuple((where, tuple(its)) for where, its in scopes)) for src, dev, scopes in records),
    )


class Programs:
    """An engine's programs, by layout, made on first use and kept while the layout lives: the
    reader keeps one layout per node (its ``Plan``) and drops it when the node's batches change; a
    read's cut batches make layouts that live only as long as their scrapes. Held strongly, the
    programs of those grew by two a read (a gigabyte in a day at 50,000)."""

    def __init__(self, wanted: Mapping[str, Collection[str]], run_host: str) -> None:
        self.wanted, self.run_host = wanted, run_host
        self._by_layout: weakref.WeakKeyDictionary[Layout, Program] = weakref.WeakKeyDictionary()

    def of(self, layout: Layout) -> Program:
        program = self._by_layout.get(layout)
        if program is None:
            program = self._by_layout[layout] = compile_layout(layout, self.wanted, self.run_host)
        return program

    def __len__(self) -> int:
        return len(self._by_layout)


def absorb_rows(program: Program, node: str, scrape: ScrapeRows, record: RecordOf, run_host: RunHost) -> None:
    """``scrape`` of ``node`` into the engine's records through its layout's ``program``:
    ``record`` is ``DetectionEngine._record``, ``run_host`` its ``_run_host``."""
    ts = scrape.ts
    rows: Sequence[Sequence[Any]] = scrape.rows  # a column by its index
    for labels in program.hosts:
        run_host(node, ts, labels)
    for src, device, scopes in program.records:
        have = record(node, src, device, ts).scopes
        for where, items in scopes:
            scope = have.get(where)
            if scope is None:
                scope = have[where] = {}
            for i, metric, col in items:
                value = rows[i][col]
                if value is None:
                    scope.pop(metric, None)  # no honest rate this scrape: no input
                else:
                    scope[metric] = value
