"""The central's fleet text renderer (``fabricd.exposition_text``) against prometheus_client.

The oracle is prometheus_client itself: ``generate_latest`` over ``fabricd.exposition.fleet_families``
(what the central served before the cache). Both outputs are compared byte for byte and as parsed
samples, on the real collectors' samples and on the cases that stress escaping, caps and types.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from fabricd.exposition import Limits, SeriesBudget, fleet_families
from fabricd.exposition_text import FleetText
from fabricd.model import Kind, Reading, Sample, Status
from fabricd.server.fleet_summary import FleetSignals
from fabricd.server.metrics import FleetCollector, FleetView, ServerMetrics, render
from fabricd.server.store.storage import Storage
from tests.catalogue_samples import all_samples
from tests.support.server import ib_sample, make_batch, sqlite_storage

T0 = 1_800_000_000.0
Rows = list[tuple[str | None, Sample]]


class _Fixed:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


def _oracle(rows: Rows, budget: SeriesBudget) -> str:
    by_node: dict[str | None, list[Sample]] = {}
    for node, s in rows:
        by_node.setdefault(node, []).append(s)
    return generate_latest(_Fixed(fleet_families(by_node.items(), budget))).decode()


def _fast(text: FleetText, rows: Rows) -> str:
    return "".join(fam.text() for fam in text.families(rows))


def _parsed(text: str) -> list[tuple[str, str, str, list[tuple[str, tuple[tuple[str, str], ...], str]]]]:
    """(name, type, HELP, samples) per family; values by repr so NaN compares equal to NaN."""
    return [
        (f.name, f.type, f.documentation, [(s.name, tuple(sorted(s.labels.items())), repr(s.value)) for s in f.samples])
        for f in text_string_to_metric_families(text)
    ]


def _assert_same(rows: Rows, limits: Limits = Limits()) -> FleetText:
    fast_budget, slow_budget = SeriesBudget(limits), SeriesBudget(limits)
    text = FleetText(fast_budget)
    for _scrape in range(2):  # the second scrape renders from the cached prefixes
        fast, slow = _fast(text, rows), _oracle(rows, slow_budget)
        assert _parsed(fast) == _parsed(slow)
        assert fast == slow
    assert fast_budget.refused == slow_budget.refused
    return text


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Sample]]:
    return asyncio.run(all_samples(tmp_path_factory.mktemp("fast")))


def test_real_collector_output_renders_as_prometheus_client_does(emitted: dict[str, list[Sample]]) -> None:
    rows: Rows = [(node, s) for node in ("node-001", "node-002") for ss in emitted.values() for s in ss]
    assert len(rows) > 200
    _assert_same(rows)


def _reading(
    counter: str,
    value: float,
    kind: Kind = Kind.COUNTER,
    labels: tuple[tuple[str, str], ...] = (),
    device: str = "mlx5_0",
) -> Reading:
    return Reading("infiniband", device, "1", counter, value, "bytes", kind, labels, "")


def test_escaping_float_formats_and_every_kind_match() -> None:
    nasty = (("cable", 'say "hi"\\ \n next'), ("ünï", "cödé"), ("detail", "free text is dropped"))
    values = [
        0.0,
        -1.5,
        1e-9,
        3,
        999999.5,
        1e6,
        -1e6,
        1234567.0,
        12345678.0,
        1.7e19,
        math.inf,
        -math.inf,
        math.nan,
        2**64 - 1.0,
    ]
    rows: Rows = [("n1", Sample(T0, _reading(f"c{i}", v, labels=nasty), rate=v)) for i, v in enumerate(values)]
    rows += [
        ("n1", Sample(T0, _reading("sat", 2**32 - 1.0), None, Status.SATURATED, since=T0 - 60)),
        ("n1", Sample(T0, _reading("sat2", 2**32 - 1.0), None, Status.SATURATED)),
        ("n2", Sample(T0, _reading("state", 3.0, Kind.GAUGE))),
        ("n2", Sample(T0, _reading("fw", 0.0, Kind.INFO, (("version", "28.39.1002"),)))),
        ("n2", Sample(T0, _reading("abort", 1.0, Kind.EVENT))),
        (None, Sample(T0, _reading("nodeless", 7.0, Kind.GAUGE))),
    ]
    _assert_same(rows)


def test_caps_type_conflicts_and_repeats_are_refused_and_counted_alike() -> None:
    rows: Rows = [("n1", Sample(T0, _reading("x", float(i), device=f"mlx5_{i}"), rate=1.0)) for i in range(25)]
    rows.append(("n1", Sample(T0, _reading("x", 1.0, labels=(("cable", "y" * 17),)), rate=1.0)))
    rows.append(("n1", rows[0][1]))  # a repeated series: exposed once, the last value wins
    clash = Reading("infiniband", "mlx5_0", "1", "x", 5.0, "bytes", Kind.GAUGE, (), "")
    total = Reading("infiniband", "mlx5_0", "1", "y", 5.0, "", Kind.GAUGE, (), "x_bytes_total")
    rows += [("n1", Sample(T0, clash)), ("n1", Sample(T0, total))]
    text = _assert_same(rows, Limits(max_series_per_family=10, max_label_value_length=16))
    assert ("fabricd_infiniband_x_bytes", "family_cap") in text.budget.refused
    assert ("fabricd_infiniband_x_bytes", "type_conflict") in text.budget.refused
    assert ("fabricd_infiniband_x_bytes", "label_too_long") in text.budget.refused


def test_a_series_that_vanishes_leaves_the_output_and_the_cache() -> None:
    a = ("n1", Sample(T0, _reading("a", 1.0), rate=2.0))
    b = ("n2", Sample(T0, _reading("b", 3.0), rate=None))
    text = FleetText(SeriesBudget())
    assert 'node="n1"' in _fast(text, [a, b]) and len(text.cache) == 2
    after = _fast(text, [b])
    assert 'node="n1"' not in after and "fabricd_infiniband_a_bytes" not in after
    assert list(text.cache) and len(text.cache) == 1
    # A series whose rate becomes unknown loses its per-second series, from the cache too.
    b_sat = ("n2", Sample(T0 + 10, _reading("b", 3.0), None, Status.SATURATED))
    assert "_per_second" not in _fast(text, [b_sat]) and "fabricd_saturated_since" in _fast(text, [b_sat])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Storage]:
    with sqlite_storage(tmp_path / "fabricd.db") as storage:
        yield storage


def test_metrics_route_renders_the_registry_as_generate_latest_and_drops_stale_nodes(store: Storage) -> None:
    now = [T0]
    registry = CollectorRegistry(auto_describe=False)
    ServerMetrics(registry).batches.inc(3)
    view = FleetView(enabled=True, stale_seconds=300.0)
    registry.register(
        FleetCollector(store.latest, store.inventory, store.incidents, view, FleetSignals(), lambda: now[0])
    )
    store.writer.ingest(make_batch("old", "b1", [ib_sample(T0 - 200)], ts=T0 - 200), T0 - 200, 1000)
    store.writer.ingest(make_batch("new", "b2", [ib_sample(T0, device=f"mlx5_{i}") for i in range(3)], ts=T0), T0, 1000)
    fast = render(registry).decode()
    assert sorted(_parsed(fast)) == sorted(_parsed(generate_latest(registry).decode()))
    assert fast.count("# TYPE fabricd_infiniband_port_transmit_data_bytes_total counter") == 1
    assert 'fabricd_infiniband_port_transmit_data_bytes_total{device="mlx5_0",node="old",port="1"} 4096.0' in fast
    now[0] = T0 + 150  # "old" last reported 350 s ago: past metrics_stale_seconds
    fast = render(registry).decode()
    assert 'fabricd_infiniband_port_transmit_data_bytes_total{device="mlx5_0",node="old"' not in fast
    assert 'fabricd_agent_last_seen_timestamp_seconds{node="old"}' in fast  # the node is known, its series stale
    assert fast.count('fabricd_infiniband_port_transmit_data_bytes_per_second{device="mlx5_') == 3
    assert sorted(_parsed(fast)) == sorted(_parsed(generate_latest(registry).decode()))
