"""The central's ``/metrics``: bounded by default whatever the fleet size, the fleet view opt-in and capped.

A real central (SQLite, in-process, its lifespan run) ingests real batches over its HTTP API; the
page is parsed with prometheus_client's parser. Sizes are compared between a 3-node and a 30-node
fleet: the same families, the same number of series, only the counts in them grow.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fabricd.model import CollectorHealth, Kind, Reading, Sample
from fabricd.server.app import create_app
from fabricd.server.fleet_summary import MAX_SIGNALS, FleetSignals
from fabricd.settings import ServerSettings
from tests.support.server import encoded, ib_sample, make_batch, running

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def derived(ts: float, device: str, value: float, name: str = "ecn_marked_ratio") -> Sample:
    return Sample(ts, Reading("derived", device, "1", name, value, "ratio", Kind.GAUGE, (), name))


def node_batch(node: str, i: int, ts: float, collector_ok: bool = True) -> Any:
    samples = [ib_sample(ts, device=f"mlx5_{d}", rate=1e9) for d in range(2)]
    samples += [derived(ts, f"mlx5_{d}", 0.001 * (i + 1) * (d + 1)) for d in range(2)]
    batch = make_batch(node, f"{node}-{ts}", samples, ts=ts)
    health = [CollectorHealth("infiniband", True, 0.004, ts), CollectorHealth("ethtool", collector_ok, 0.01, ts)]
    return dataclasses.replace(batch, health=health)


class Central:
    def __init__(self, client: Any) -> None:
        self.client = client

    async def post(self, batch: Any) -> None:
        body, headers = encoded(batch)
        resp = await self.client.post("/api/v1/ingest", content=body, headers=headers)
        assert resp.status_code == 200, resp.text

    async def series(self) -> Series:
        text = (await self.client.get("/metrics")).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
        }


@pytest.fixture
def central(tmp_path: Path) -> Callable[..., Any]:
    def make(clock: Callable[[], float] = time.time, **kw: Any) -> Any:
        settings = ServerSettings(data_dir=tmp_path / f"data-{len(list(tmp_path.iterdir()))}", auth=False, **kw)
        app = create_app(settings, clock=clock)

        class _Run:
            async def __aenter__(self) -> Central:
                self.ctx = running(app)
                return Central(await self.ctx.__aenter__())

            async def __aexit__(self, *exc: object) -> None:
                await self.ctx.__aexit__(*exc)

        return _Run()

    return make


def fleet(series: Series) -> Series:
    """The fleet summaries and incidents (the rest is the service's own, the same at any size)."""
    return {k: v for k, v in series.items() if k[0].startswith(("fabricd_fleet_", "fabricd_incidents_open"))}


async def _fill(c: Central, nodes: int, now: float) -> None:
    for i in range(nodes):
        await c.post(node_batch(f"node-{i:03d}", i, now, collector_ok=i % 3 != 0))


async def test_the_page_does_not_grow_with_the_fleet(central: Callable[..., Any]) -> None:
    now = time.time()
    async with central() as small:
        await _fill(small, 3, now)
        three = await small.series()
    async with central() as large:
        await _fill(large, 30, now)
        thirty = await large.series()
    assert len(thirty) == len(three)
    assert {name for name, _ in thirty} == {name for name, _ in three}
    assert not any(
        dict(labels).get("node", "").startswith("node-0") for _n, labels in three if _n != "fabricd_fleet_signal_max"
    )
    summary = fleet(thirty)
    assert summary[("fabricd_fleet_nodes", (("state", "reporting"),))] == 30.0
    assert summary[("fabricd_fleet_nodes", (("state", "stale"),))] == 0.0
    assert summary[("fabricd_fleet_agent_version_nodes", (("version", "0.1.0"),))] == 30.0
    assert summary[("fabricd_fleet_collector_nodes", (("collector", "ethtool"), ("state", "failing")))] == 10.0
    assert summary[("fabricd_fleet_collector_nodes", (("collector", "ethtool"), ("state", "ok")))] == 20.0
    assert summary[("fabricd_fleet_collector_nodes", (("collector", "infiniband"), ("state", "ok")))] == 30.0
    signal = (("signal", "ecn_marked_ratio"),)
    assert summary[("fabricd_fleet_signal_series", signal)] == 60.0
    # values 0.001 * (i + 1) * (d + 1) for i < 30, d < 2: mean 0.001 * 15.5 * 1.5
    assert summary[("fabricd_fleet_signal_mean", signal)] == pytest.approx(0.02325)
    worst = (("device", "mlx5_1"), ("node", "node-029"), ("port", "1"), ("signal", "ecn_marked_ratio"))
    assert summary[("fabricd_fleet_signal_max", worst)] == pytest.approx(0.06)
    assert not any(name.startswith("fabricd_infiniband_") for name, _ in thirty)
    assert not any(name == "fabricd_agent_last_seen_timestamp_seconds" for name, _ in thirty)


async def test_silent_nodes_count_as_stale_and_their_signals_leave(central: Callable[..., Any]) -> None:
    now = [time.time()]
    async with central(clock=lambda: now[0], node_stale_seconds=120, metrics_stale_seconds=300) as c:
        await c.post(node_batch("node-a", 0, now[0]))
        await c.post(node_batch("node-b", 1, now[0]))
        now[0] += 200  # past node_stale_seconds, within metrics_stale_seconds
        await c.post(node_batch("node-b", 1, now[0]))
        summary = fleet(await c.series())
        assert summary[("fabricd_fleet_nodes", (("state", "reporting"),))] == 1.0
        assert summary[("fabricd_fleet_nodes", (("state", "stale"),))] == 1.0
        assert summary[("fabricd_fleet_signal_series", (("signal", "ecn_marked_ratio"),))] == 4.0
        now[0] += 150  # node-a's derived values are now 350 s old: past metrics_stale_seconds
        summary = fleet(await c.series())
        assert summary[("fabricd_fleet_signal_series", (("signal", "ecn_marked_ratio"),))] == 2.0


async def test_the_fleet_view_is_opt_in_and_hard_capped(central: Callable[..., Any]) -> None:
    now = time.time()
    async with central(metrics_fleet_view=True, metrics_fleet_max_series=7) as c:
        await _fill(c, 3, now)  # 3 nodes x 2 ports x (counter + rate) + 6 derived = 18 fleet series
        series = await c.series()
    per_node = {k for k in series if k[0].startswith(("fabricd_infiniband_", "fabricd_derived_"))}
    assert len(per_node) == 7
    refused = {
        (dict(k[1])["family"], dict(k[1])["reason"]): v
        for k, v in series.items()
        if k[0] == "fabricd_exporter_series_refused_total"
    }
    assert refused == {  # node-000's 6 series and node-001's first: the rest refused, and counted
        ("fabricd_infiniband_port_transmit_data_bytes", "fleet_cap"): 3.0,
        ("fabricd_infiniband_port_transmit_data_bytes_per_second", "fleet_cap"): 4.0,
        ("fabricd_derived_ecn_marked_ratio", "fleet_cap"): 4.0,
    }
    assert series[("fabricd_agent_last_seen_timestamp_seconds", (("node", "node-002"),))] == pytest.approx(now, abs=5)


def test_an_older_value_never_replaces_a_newer_one_and_rogue_signal_names_are_capped() -> None:
    signals = FleetSignals()
    t = 1_800_000_000.0
    signals.observe("n1", [derived(t, "mlx5_0", 0.5)])
    signals.observe("n1", [derived(t - 60, "mlx5_0", 0.9)])  # a spooled backlog, drained late
    names = {f.name: f for f in signals.families(t - 300)}
    assert [s.value for s in names["fabricd_fleet_signal_max"].samples] == [0.5]
    signals.observe("n1", [derived(t, "mlx5_0", 1.0, name=f"rogue_{i}") for i in range(MAX_SIGNALS + 5)])
    series = {f.name: f for f in signals.families(t - 300)}["fabricd_fleet_signal_series"].samples
    assert len(series) == MAX_SIGNALS
    assert signals.budget.refused[("fabricd_fleet_signal_series", "family_cap")] == 6
