"""The transport end to end against a local central: live sends, outages, drain, limits, damage."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricd.settings import AgentSettings, SpoolSettings, TransportSettings
from fabricd.transport import Transport
from fabricd.transport.batcher import Batcher
from fabricd.transport.sender import HttpxPoster, Poster
from fabricd.transport.spool import QUARANTINE, pack
from fabricd.wire import MSGPACK, encode
from tests.test_transport_central_double import CentralDouble, Scripted, scrape, stored_timestamps, until


def _settings(tmp_path: Path, central: CentralDouble, **spool: float) -> AgentSettings:
    # 4 samples per scrape and batch_max_samples=4: one scrape is one batch, so counts are exact.
    return AgentSettings(
        node="n1",
        central=central.url,
        data_dir=tmp_path,
        token="t0k",
        transport=TransportSettings(
            batch_max_samples=4,
            batch_max_seconds=60,
            backoff_initial_seconds=0.05,
            backoff_max_seconds=0.2,
            timeout_seconds=1.0,
            compress=False,
        ),
        spool=SpoolSettings.model_validate({"drain_batches_per_second": 50.0, **spool}),
    )


async def _transport(settings: AgentSettings) -> tuple[Transport, CollectorRegistry]:
    registry = CollectorRegistry()
    transport = Transport(settings, agent_version="test", registry=registry)
    await transport.start()
    return transport, registry


def _metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels or None) or 0.0


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    """What an operator reads: each message with its logfmt fields."""
    return "\n".join(f"{r.getMessage()} {getattr(r, 'fields', {})}" for r in caplog.records)


async def _submit(transport: Transport, first: int, last: int) -> None:
    for ts in range(first, last + 1):
        await transport.submit(scrape(float(ts)), [])


async def test_live_batches_reach_the_central_and_nothing_is_spooled(tmp_path: Path) -> None:
    central = CentralDouble()
    await central.start()
    transport, registry = await _transport(_settings(tmp_path, central))
    try:
        await _submit(transport, 1, 5)
        await until(lambda: len(central.order) == 5)
    finally:
        await transport.close()
        await central.stop()
    assert stored_timestamps(central) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert _metric(registry, "fabricd_agent_batches_sent_total") == 5
    assert _metric(registry, "fabricd_agent_batches_spooled_total") == 0
    assert _metric(registry, "fabricd_agent_last_successful_send_timestamp_seconds") > 0


async def test_an_outage_is_spooled_then_drained_oldest_first_without_gap_or_duplicate(tmp_path: Path) -> None:
    central = CentralDouble()  # not started: connection refused
    transport, registry = await _transport(_settings(tmp_path, central))
    try:
        await _submit(transport, 1, 10)
        await until(lambda: _metric(registry, "fabricd_agent_batches_spooled_total") == 10)
        assert _metric(registry, "fabricd_agent_spool_bytes") > 0
        await central.start()
        await until(lambda: len(central.order) == 10)
        await until(lambda: _metric(registry, "fabricd_agent_spool_batches") == 0)
    finally:
        await transport.close()
        await central.stop()
    arrival = [central.batches[b].samples[0].ts for b in central.order]
    assert arrival == sorted(arrival)  # the backlog drains oldest first
    assert stored_timestamps(central) == [float(t) for t in range(1, 11)]
    assert _metric(registry, "fabricd_agent_batches_retried_total") >= 10


async def test_live_data_is_not_starved_by_a_backlog(tmp_path: Path) -> None:
    central = CentralDouble()
    transport, _ = await _transport(_settings(tmp_path, central, drain_batches_per_second=10.0))
    try:
        await _submit(transport, 1, 20)
        await until(lambda: len(transport.spool) == 20)
        await central.start()
        await until(lambda: len(central.order) >= 2)  # the backlog has started to drain
        await _submit(transport, 100, 100)
        await until(lambda: len(central.order) == 21)
    finally:
        await transport.close()
        await central.stop()
    arrival = [central.batches[b].samples[0].ts for b in central.order]
    assert arrival.index(100.0) < 20  # the fresh batch did not wait behind the whole backlog
    assert [t for t in arrival if t != 100.0] == [float(t) for t in range(1, 21)]


async def test_retry_after_is_honoured(tmp_path: Path) -> None:
    central = CentralDouble()
    central.script = [Scripted(429, '{"detail": "shedding load"}', {"Retry-After": "1"})]
    await central.start()
    transport, _ = await _transport(_settings(tmp_path, central))
    try:
        await _submit(transport, 1, 1)
        await until(lambda: len(central.order) == 1)
    finally:
        await transport.close()
        await central.stop()
    (t_shed, _, status), (t_ok, _, _) = central.requests
    assert status == 429
    assert t_ok - t_shed >= 1.0  # not before the server said it could take more


async def test_a_rejected_batch_is_quarantined_with_the_servers_message_and_not_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    central = CentralDouble()
    central.script = [Scripted(422, '{"detail": "samples[0].labels has too many values"}')]
    await central.start()
    transport, registry = await _transport(_settings(tmp_path, central))
    try:
        with caplog.at_level(logging.ERROR, "fabricd.transport"):
            await _submit(transport, 1, 2)
            await until(lambda: len(central.order) == 1)
            await until(lambda: _metric(registry, "fabricd_agent_spool_quarantined_total") == 1)
    finally:
        await transport.close()
        await central.stop()
    assert len(stored_timestamps(central)) == 1
    rejected = [b for _, b, s in central.requests if s == 422]
    assert len(rejected) == 1 and rejected[0] not in central.batches
    assert [b for _, b, _ in central.requests].count(rejected[0]) == 1  # tried once, never again
    assert _metric(registry, "fabricd_agent_batches_dropped_total", reason="rejected") == 1
    reasons = list((tmp_path / "spool" / QUARANTINE).glob("*.reason"))
    assert len(reasons) == 1 and "too many values" in reasons[0].read_text()
    assert "too many values" in _logged(caplog)


async def test_a_full_spool_drops_the_oldest_counts_them_and_recovers(tmp_path: Path) -> None:
    central = CentralDouble()
    batch = Batcher("n1", "test", 4, 60.0, time.time).add(scrape(1.0), [], 0.0)[0]
    one = len(pack(batch.batch_id, encode(batch, MSGPACK, compress=False), 0))  # every batch has this size
    transport, registry = await _transport(_settings(tmp_path, central, max_bytes=3 * one))
    try:
        await _submit(transport, 1, 10)
        await until(lambda: _metric(registry, "fabricd_agent_batches_spooled_total") == 10)
        assert _metric(registry, "fabricd_agent_batches_dropped_total", reason="spool_full") == 7
        assert _metric(registry, "fabricd_agent_spool_bytes") <= 3 * one
        await central.start()
        await until(lambda: len(central.order) == 3)
        await _submit(transport, 11, 11)  # and live data flows again
        await until(lambda: len(central.order) == 4)
    finally:
        await transport.close()
        await central.stop()
    assert stored_timestamps(central) == [8.0, 9.0, 10.0, 11.0]  # the newest were kept


async def test_close_spools_what_is_pending_and_a_restarted_transport_sends_it(tmp_path: Path) -> None:
    central = CentralDouble()
    settings = _settings(tmp_path, central).model_copy(
        update={"transport": TransportSettings(batch_max_samples=1000, batch_max_seconds=60, compress=False)}
    )
    transport, _ = await _transport(settings)
    await _submit(transport, 1, 3)  # below both bounds: only close() can flush it
    await transport.close()
    await central.start()
    again, registry = await _transport(settings)
    try:
        await until(lambda: len(central.order) == 1)
        await until(lambda: _metric(registry, "fabricd_agent_spool_batches") == 0)
    finally:
        await again.close()
        await central.stop()
    assert stored_timestamps(central) == [1.0, 2.0, 3.0]


async def test_a_batch_in_flight_at_shutdown_is_delivered_exactly_once(tmp_path: Path) -> None:
    central = CentralDouble()
    # The central stores the batch but answers too late: the agent cannot know it arrived.
    central.script = [Scripted(200, delay=3.0, store=True)]
    await central.start()
    settings = _settings(tmp_path, central)
    transport, _ = await _transport(settings)
    await _submit(transport, 1, 1)
    await until(lambda: len(central.order) == 1)
    await transport.close()
    assert len(transport.spool) == 1  # not acknowledged, so kept
    again, registry = await _transport(settings)
    try:
        await until(lambda: _metric(registry, "fabricd_agent_batches_sent_total") == 1)
    finally:
        await again.close()
        await central.stop()
    assert stored_timestamps(central) == [1.0]
    assert len(again.spool) == 0


async def test_a_truncated_spool_file_is_quarantined_and_the_intact_ones_are_sent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    central = CentralDouble()
    settings = _settings(tmp_path, central)
    transport, _ = await _transport(settings)
    await _submit(transport, 1, 3)
    await until(lambda: len(transport.spool) == 3)
    await transport.close()
    middle = transport.spool.entries()[1].path
    middle.write_bytes(middle.read_bytes()[:-7])  # power loss mid-write on a careless filesystem
    await central.start()
    again, registry = await _transport(settings)
    try:
        with caplog.at_level(logging.ERROR, "fabricd.transport"):
            await until(lambda: len(central.order) == 2)
            await until(lambda: _metric(registry, "fabricd_agent_spool_quarantined_total") == 1)
    finally:
        await again.close()
        await central.stop()
    assert stored_timestamps(central) == [1.0, 3.0]
    assert _metric(registry, "fabricd_agent_batches_dropped_total", reason="corrupt") == 1
    assert (tmp_path / "spool" / QUARANTINE / middle.name).exists()
    assert "truncated" in _logged(caplog)


async def test_an_unencodable_batch_is_dropped_counted_and_the_next_one_still_flows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    central = CentralDouble()
    await central.start()
    base = _settings(tmp_path, central)
    settings = base.model_copy(update={"transport": base.transport.model_copy(update={"encoding": "json"})})
    transport, registry = await _transport(settings)
    try:
        with caplog.at_level(logging.ERROR, "fabricd.transport"):
            await transport.submit([replace(s, rate=math.nan) for s in scrape(1.0)], [])  # JSON has no NaN
            await until(lambda: _metric(registry, "fabricd_agent_batches_dropped_total", reason="invalid") == 1)
        await _submit(transport, 2, 2)
        await until(lambda: len(central.order) == 1)
    finally:
        await transport.close()
        await central.stop()
    assert stored_timestamps(central) == [2.0]
    assert "cannot be encoded" in _logged(caplog)


async def test_a_send_cut_short_by_shutdown_is_spooled_not_lost(tmp_path: Path) -> None:
    central = CentralDouble()
    central.script = [Scripted(200, delay=3.0)]  # answers after the agent has given up waiting
    await central.start()
    settings = _settings(tmp_path, central)  # close() waits timeout_seconds (1 s) for sends ...

    def patient_poster(cfg: TransportSettings) -> Poster:
        return HttpxPoster(cfg.model_copy(update={"timeout_seconds": 30.0}))  # ... the request would wait 30 s

    transport = Transport(settings, agent_version="test", poster_factory=patient_poster)
    await transport.start()
    try:
        await _submit(transport, 1, 1)
        await until(lambda: len(central.headers) == 1)  # the request is in flight
        await transport.close()
    finally:
        await central.stop()
    assert [transport.spool.read(e).batch_id for e in transport.spool.entries()] == [b for _, b, _ in central.requests]


async def test_by_default_each_scrape_is_sent_as_it_ends_without_waiting_in_a_batch(tmp_path: Path) -> None:
    # Settlement waits for every node's scrape (fabricd.detect.settle): a scrape held back in an open
    # batch delays every incident, so the default sends each one at once, as its own batch.
    central = CentralDouble()
    await central.start()
    settings = _settings(tmp_path, central).model_copy(update={"transport": TransportSettings(compress=False)})
    assert settings.transport.batch_max_seconds == 0
    transport, _ = await _transport(settings)
    try:
        for ts in (1.0, 2.0):
            await transport.submit(scrape(ts), [])
            assert transport.batcher.pending == 0  # closed with the scrape, not left for a timer
        await until(lambda: len(central.order) == 2)
    finally:
        await transport.close()
        await central.stop()
    assert stored_timestamps(central) == [1.0, 2.0]
