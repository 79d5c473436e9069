"""What the sender makes of the central's answers, over real HTTP(S) to a local server."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path

import pytest

from fabricd.model import Batch
from fabricd.settings import TransportSettings
from fabricd.transport.sender import (
    Backoff,
    Outcome,
    PostResult,
    Sender,
    classify,
    default_poster_factory,
    parse_retry_after,
)
from fabricd.wire import MSGPACK, encode
from tests.test_transport_central_double import CentralDouble, Scripted, free_port, make_tls, scrape


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, Outcome.SENT),
        (202, Outcome.SENT),
        (429, Outcome.RETRY),
        (503, Outcome.RETRY),
        (500, Outcome.RETRY),
        (502, Outcome.RETRY),
        (408, Outcome.RETRY),
        (400, Outcome.PERMANENT),
        (401, Outcome.PERMANENT),
        (403, Outcome.PERMANENT),
        (413, Outcome.PERMANENT),
        (415, Outcome.PERMANENT),
        (422, Outcome.PERMANENT),
    ],
)
def test_status_codes_map_to_retry_or_give_up(status: int, outcome: Outcome) -> None:
    assert classify(PostResult(status), now=0.0).outcome is outcome


def test_the_servers_message_is_kept_for_the_log() -> None:
    result = classify(PostResult(422, text='{"detail": "samples[3].ts must be a number"}'), now=0.0)
    assert result.reason == "HTTP 422: samples[3].ts must be a number"
    central = classify(PostResult(401, text='{"error": "unauthorized", "message": "unknown token"}'), now=0.0)
    assert central.reason == "HTTP 401: unauthorized: unknown token"


def test_retry_after_in_seconds_or_as_an_http_date() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("7", now) == 7.0
    date = format_datetime(datetime.fromtimestamp(now + 30, UTC), usegmt=True)
    assert parse_retry_after(date, now) == pytest.approx(30.0)
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after("999999", now) == 300.0  # a misconfigured server cannot park the agent
    assert classify(PostResult(429, {"Retry-After": "3"}), now).retry_after == 3.0


def test_backoff_is_full_jitter_below_an_exponential_ceiling() -> None:
    backoff = Backoff(0.5, 8.0, random.Random(1))
    ceilings = [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    delays = [backoff.next_delay() for _ in ceilings]
    assert all(0.0 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert max(delays[4:]) > 2.0  # it does grow past the early ceilings
    backoff.reset()
    assert backoff.next_delay() <= 0.5


def _body(batch_id: str) -> bytes:
    return encode(Batch(node="n1", agent_version="t", batch_id=batch_id, samples=scrape(1.0), instance="i", seq=1))


async def _send(settings: TransportSettings, url: str, batch_id: str = "b1") -> tuple[Outcome, str, bool]:
    poster = default_poster_factory(settings)
    sender = Sender(settings, url, "secret", "0.1.0", poster)
    try:
        r = await sender.send(batch_id, _body(batch_id), MSGPACK, True)
    finally:
        await poster.aclose()  # type: ignore[attr-defined]
    return r.outcome, r.reason, r.duplicate


async def test_a_batch_reaches_the_central_with_its_headers_and_a_resend_is_a_duplicate() -> None:
    central = CentralDouble()
    await central.start()
    try:
        first = await _send(TransportSettings(), central.url)
        again = await _send(TransportSettings(), central.url)
    finally:
        await central.stop()
    assert first == (Outcome.SENT, "", False) and again == (Outcome.SENT, "", True)
    headers = central.headers[0]
    assert headers["authorization"] == "Bearer secret" and headers["content-encoding"] == "gzip"
    assert central.samples() == 4


async def test_load_shedding_and_server_errors_are_retried() -> None:
    central = CentralDouble()
    central.script = [Scripted(429, headers={"Retry-After": "2"}), Scripted(500, '{"detail": "db locked"}')]
    await central.start()
    try:
        shed = await _send(TransportSettings(), central.url)
        broken = await _send(TransportSettings(), central.url)
    finally:
        await central.stop()
    assert shed[0] is Outcome.RETRY and broken == (Outcome.RETRY, "HTTP 500: db locked", False)
    assert central.order == []


async def test_a_refused_connection_is_retried_with_the_reason() -> None:
    outcome, reason, _ = await _send(TransportSettings(), f"http://127.0.0.1:{free_port()}")
    assert outcome is Outcome.RETRY and "ConnectError" in reason


async def test_tls_with_a_custom_ca_verifies_and_a_wrong_ca_says_why(tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls")
    central = CentralDouble(certfile=tls.cert, keyfile=tls.key)
    await central.start()
    try:
        good = await _send(TransportSettings(ca_file=tls.ca), central.url, "b1")
        wrong = await _send(TransportSettings(ca_file=tls.other_ca), central.url, "b2")
        system = await _send(TransportSettings(), central.url, "b3")
    finally:
        await central.stop()
    assert good[0] is Outcome.SENT
    assert wrong[0] is Outcome.RETRY and "certificate verify failed" in wrong[1]
    assert system[0] is Outcome.RETRY and "certificate verify failed" in system[1]
    assert central.order == ["b1"]
