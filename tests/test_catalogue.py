"""The metric catalogue against what fabricd really emits, and ``promtool check metrics`` on it.

Samples come from the real collectors on the fixture trees (and real local sockets and links), so a
renamed counter, a new label or a new family without a catalogue row fails here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fabricd.catalogue import CATALOGUE, lookup
from fabricd.exposition import Limits, SamplesCollector, SeriesBudget, families, fleet_families, render
from fabricd.hooks.dispatcher import HookMetrics
from fabricd.model import Kind, Reading, Sample, Status
from fabricd.server.metrics import ServerMetrics
from fabricd.transport.metrics import TransportMetrics
from tests.catalogue_samples import NODE, all_samples
from tests.helpers import need_binary

NAME = re.compile(r"fabricd_[a-z0-9_]+")


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Sample]]:
    import asyncio

    return asyncio.run(all_samples(tmp_path_factory.mktemp("catalogue")))


def exposed(text: str) -> list[tuple[str, str, set[str]]]:
    """(exposed name, type, label names of one series) for every series in exposition text."""
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if fam.type == "histogram" and not s.name.endswith("_count"):
                continue
            name = s.name.removesuffix("_count") if fam.type == "histogram" else s.name
            base = s.name.removesuffix("_created")
            if base != s.name and (lookup(base + "_total") or lookup(base)):
                continue  # prometheus_client's creation timestamp of a counter or histogram
            out.append((name, fam.type, set(s.labels) - {"le"}))
    return out


def assert_catalogued(text: str) -> set[str]:
    seen = set()
    for name, mtype, labels in exposed(text):
        spec = lookup(name)
        assert spec is not None, f"{name} is emitted but not in fabricd.catalogue"
        assert spec.type == mtype, f"{name}: emitted as {mtype}, catalogued as {spec.type}"
        assert set(spec.labels) <= labels, f"{name}: missing labels {set(spec.labels) - labels}"
        assert labels <= set(spec.labels) | set(spec.optional), (
            f"{name}: uncatalogued labels {labels - set(spec.labels) - set(spec.optional)}"
        )
        seen.add(spec.name)
    return seen


def test_every_emitted_family_is_catalogued_with_its_type_and_labels(emitted: dict[str, list[Sample]]) -> None:
    covered: set[str] = set()
    for source, samples in emitted.items():
        assert samples, f"the {source} collector produced nothing on its fixtures"
        covered |= assert_catalogued(render(samples, NODE).decode())
    # The signals rules and dashboards rely on are among what the real collectors produced.
    for name in (
        "fabricd_derived_ecn_marked_ratio",
        "fabricd_derived_rx_pause_ratio",
        "fabricd_infiniband_port_transmit_wait_ticks_per_second",
        "fabricd_saturated_since_timestamp_seconds",
        "fabricd_ethtool_tx_pause_storm_error_events_per_second",
        "fabricd_pingmesh_rtt_p99_seconds",
        "fabricd_nccl_busbw_bytes_per_second",
        "fabricd_netlink_qdisc_drops_per_second",
    ):
        assert name in covered


def test_self_metrics_are_catalogued() -> None:
    registry = CollectorRegistry()
    ServerMetrics(registry)
    TransportMetrics(registry)
    HookMetrics(registry, ["ops"])
    seen = assert_catalogued(generate_latest(registry).decode())
    assert {"fabricd_ingest_samples_total", "fabricd_agent_spool_bytes", "fabricd_hook_notifications_total"} <= seen


def test_promtool_check_metrics_is_clean(emitted: dict[str, list[Sample]], tmp_path: Path) -> None:
    promtool = need_binary("promtool")
    fleet = [(node, samples) for node in (NODE, "node-002") for samples in emitted.values()]
    registry = CollectorRegistry(auto_describe=False)
    budget = SeriesBudget()

    class Fleet(SamplesCollector):
        def collect(self):  # type: ignore[no-untyped-def]
            yield from fleet_families(fleet, budget)
            yield budget.refused_family()

    registry.register(Fleet([]))
    text = generate_latest(registry)
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    ).decode()[:3000]
    assert not budget.refused, "nothing from real collectors should be refused"


def test_catalogue_rows_are_well_formed() -> None:
    names = [m.name for m in CATALOGUE]
    assert len(names) == len(set(names)), "duplicate catalogue rows"
    for m in CATALOGUE:
        assert m.help and m.type in {"counter", "gauge", "histogram"}
        assert m.pattern or NAME.fullmatch(m.name), m.name
        assert m.name.endswith("_total") == (m.type == "counter"), m.name
        assert not set(m.labels) & set(m.optional), m.name


def _port_sample(i: int, label: str = "") -> Sample:
    r = Reading(
        "infiniband",
        f"mlx5_{i}",
        "1",
        "port_xmit_wait",
        10.0 * i,
        "ticks",
        Kind.COUNTER,
        (("cable", label),) if label else (),
        "port_transmit_wait",
    )
    return Sample(1.0, r, rate=1.0, status=Status.OK)


def test_cardinality_caps_refuse_and_count_series() -> None:
    budget = SeriesBudget(Limits(max_series_per_family=10, max_label_value_length=16))
    samples = [_port_sample(i) for i in range(25)] + [_port_sample(99, "x" * 17)]
    fams = {f.name: f for f in families(samples, NODE, budget=budget)}
    assert len(fams["fabricd_infiniband_port_transmit_wait_ticks"].samples) == 10
    assert len(fams["fabricd_infiniband_port_transmit_wait_ticks_per_second"].samples) == 10
    families(samples, NODE, budget=budget)  # the next scrape refuses them again: the count is cumulative
    refused = {tuple(s.labels.values()): s.value for s in budget.refused_family().samples}
    assert refused[("fabricd_infiniband_port_transmit_wait_ticks", "family_cap")] == 2 * 15
    assert refused[("fabricd_infiniband_port_transmit_wait_ticks", "label_too_long")] == 2


def test_a_name_never_gets_two_types_and_a_series_never_appears_twice() -> None:
    counter = _port_sample(1)
    clash = Sample(2.0, Reading("infiniband", "mlx5_1", "1", "x", 5.0, "ticks", Kind.GAUGE, (), "port_transmit_wait"))
    total = Sample(
        2.0, Reading("infiniband", "mlx5_1", "1", "y", 5.0, "", Kind.GAUGE, (), "port_transmit_wait_ticks_total")
    )
    budget = SeriesBudget()
    text = generate_latest(_registry([counter, counter, clash, total], budget)).decode()
    assert text.count("# TYPE fabricd_infiniband_port_transmit_wait_ticks_total counter") == 1
    assert text.count("fabricd_infiniband_port_transmit_wait_ticks_total{") == 1
    assert "# TYPE fabricd_infiniband_port_transmit_wait_ticks gauge" not in text
    assert budget.refused == {
        ("fabricd_infiniband_port_transmit_wait_ticks", "type_conflict"): 1,
        ("fabricd_infiniband_port_transmit_wait_ticks_total", "type_conflict"): 1,
    }


def _registry(samples: list[Sample], budget: SeriesBudget) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SamplesCollector(samples, NODE, budget))
    return registry


def test_help_text_comes_from_the_catalogue(emitted: dict[str, list[Sample]]) -> None:
    text = render(emitted["infiniband"], NODE).decode()
    assert "# HELP fabricd_infiniband_port_transmit_wait_ticks_total Ticks the port had data to send" in text
    assert 'fabricd_infiniband_port_transmit_data_bytes_total{device="mlx5_0",node="node-001",port="1"}' in text
