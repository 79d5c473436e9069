"""Rolling upgrades at the transport: wire versions, and a central that does not read the agent's.

The central double stands for another release (``reads``): an older central that reads only
versions 1 and 2, or a newer one that no longer reads version 1. Whatever the mismatch, a batch is kept in the
spool and retried; nothing is dropped or quarantined for a version (docs/transport.md).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricd.settings import AgentSettings, TransportSettings
from fabricd.transport.batcher import Batcher
from fabricd.transport.spool import QUARANTINE
from tests.test_transport_central_double import CentralDouble, scrape, stored_timestamps, until
from tests.test_transport_flow import _metric, _transport
from tests.test_transport_flow import _settings as flow_settings


def _settings(tmp_path: Path, central: CentralDouble, wire_version: int = 3) -> AgentSettings:
    """test_transport_flow's settings (one scrape is one batch), speaking ``wire_version``."""
    base = flow_settings(tmp_path, central)
    return base.model_copy(
        update={"transport": TransportSettings(**{**dict(base.transport), "wire_version": wire_version})}
    )


def _refused(central: CentralDouble) -> int:
    return sum(1 for _, _, status in central.requests if status == 422)


def _quarantined(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "spool" / QUARANTINE
    return sorted(folder.iterdir()) if folder.exists() else []


def _dropped(registry: CollectorRegistry) -> float:
    reasons = ("spool_full", "disk_full", "spool_error", "too_large", "corrupt", "rejected", "invalid")
    return sum(_metric(registry, "fabricd_agent_batches_dropped_total", reason=r) for r in reasons)


async def test_an_agent_newer_than_the_central_keeps_its_spool_and_delivers_after_the_upgrade(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    central = CentralDouble()
    central.reads = (1, 2)  # the previous release
    await central.start()
    transport, registry = await _transport(_settings(tmp_path, central))
    try:
        with caplog.at_level(logging.WARNING, "fabricd.transport"):
            for ts in range(1, 7):
                await transport.submit(scrape(float(ts)), [])
            await until(lambda: _metric(registry, "fabricd_agent_spool_batches") == 6)
            await until(lambda: _refused(central) >= 3)  # retried with backoff, refused each time
        assert central.order == []
        assert _quarantined(tmp_path) == []
        assert _metric(registry, "fabricd_agent_spool_quarantined_total") == 0
        assert any("does not read wire version 3" in r.getMessage() for r in caplog.records)
        central.reads = (1, 2, 3)  # the central is upgraded
        await until(lambda: len(central.order) == 6)
        await until(lambda: _metric(registry, "fabricd_agent_spool_batches") == 0)
    finally:
        await transport.close()
        await central.stop()
    assert stored_timestamps(central) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert {central.batches[b].schema_version for b in central.order} == {3}
    assert (_dropped(registry), _quarantined(tmp_path)) == (0, [])


@pytest.mark.parametrize("version,seqs", [(2, [1, 2, 3]), (1, [None, None, None])])  # v1 has no seq
async def test_an_agent_set_to_an_older_version_is_read_by_the_previous_release(
    tmp_path: Path, version: int, seqs: list[int | None]
) -> None:
    central = CentralDouble()
    central.reads = (1, 2)
    await central.start()
    transport, registry = await _transport(_settings(tmp_path, central, wire_version=version))
    try:
        for ts in range(1, 4):
            await transport.submit(scrape(float(ts)), [])
        await until(lambda: len(central.order) == 3)
    finally:
        await transport.close()
        await central.stop()
    assert stored_timestamps(central) == [1.0, 2.0, 3.0]
    assert [central.batches[b].schema_version for b in central.order] == [version] * 3
    assert [central.batches[b].seq for b in central.order] == seqs
    assert _refused(central) == 0 and _dropped(registry) == 0


async def test_old_spooled_batches_a_newer_central_cannot_read_wait_aside_and_live_data_flows(
    tmp_path: Path,
) -> None:
    old_central = CentralDouble()  # not started: the version 1 agent spools everything
    old_agent, _ = await _transport(_settings(tmp_path, old_central, wire_version=1))
    for ts in range(1, 4):
        await old_agent.submit(scrape(float(ts)), [])
    await old_agent.close()
    assert len(list((tmp_path / "spool").glob("*.batch"))) == 3
    central = CentralDouble()
    central.reads = (2, 3)  # a release that no longer reads version 1 (the agent skipped one)
    await central.start()
    transport, registry = await _transport(_settings(tmp_path, central))
    try:
        await until(lambda: _refused(central) == 3)  # each old batch tried once, then parked
        for ts in range(10, 13):
            await transport.submit(scrape(float(ts)), [])
        await until(lambda: len(central.order) == 3)
        assert _refused(central) == 3  # parked batches are not hammered
    finally:
        await transport.close()
        await central.stop()
    assert stored_timestamps(central) == [10.0, 11.0, 12.0]
    assert len(list((tmp_path / "spool").glob("*.batch"))) == 3  # the old ones kept, never dropped
    assert (_dropped(registry), _quarantined(tmp_path)) == (0, [])


def test_batches_carry_the_instance_and_a_sequence_in_creation_order() -> None:
    now = [100.0]
    a = Batcher("n1", "t", max_samples=4, max_seconds=60, wall_clock=lambda: now[0])
    b = Batcher("n1", "t", max_samples=4, max_seconds=60, wall_clock=lambda: now[0])
    made = a.add(scrape(5.0, ports=2) + scrape(7.0, ports=2) + scrape(9.0, ports=4) + scrape(3.0, ports=1), [], 0.0)
    last = a.flush()
    assert last is not None
    made.append(last)
    assert [(x.seq, x.first_ts, x.last_ts, len(x.samples)) for x in made] == [
        (1, 5.0, 7.0, 4),
        (2, 9.0, 9.0, 4),
        (3, 3.0, 3.0, 1),
    ]
    assert {x.instance for x in made} == {a.instance}
    assert len(a.instance) == 32 and a.instance != b.instance  # uuid4 hex, one per agent process
    assert a.flush() is None and a.seq == 3  # no batch, no number used


def test_the_wire_version_setting_takes_exactly_the_versions_this_release_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fabricd import settings, wire

    assert TransportSettings().wire_version == wire.SCHEMA_VERSION
    monkeypatch.setenv("FABRICD_TRANSPORT__WIRE_VERSION", "2")  # as an operator sets it
    assert settings.load(AgentSettings).transport.wire_version == 2
    for bad in ("0", "4"):
        monkeypatch.setenv("FABRICD_TRANSPORT__WIRE_VERSION", bad)
        with pytest.raises(settings.SettingsError, match=r"transport.wire_version: must be one of 1, 2, 3 "):
            settings.load(AgentSettings)


def test_parked_batches_are_released_for_another_try_after_their_delay() -> None:
    from fabricd.transport.versions import PARKED_RETRY_SECONDS, Parked

    parked = Parked()
    assert (parked.keys(0.0), parked.wait_seconds(0.0)) == ([], None)
    parked.add(7, now=100.0)
    parked.add(9, now=160.0)
    assert parked.keys(100.0 + PARKED_RETRY_SECONDS - 1) == [7, 9]
    assert parked.wait_seconds(100.0) == PARKED_RETRY_SECONDS
    assert parked.keys(100.0 + PARKED_RETRY_SECONDS) == [9]  # 7's time has come: tried again
    parked.discard(9)
    assert (parked.keys(0.0), parked.wait_seconds(0.0)) == ([], None)
