"""The link decides when a down central is probed again: backoff, Retry-After, one probe at a time."""

from __future__ import annotations

import random

from fabricd.transport.link import Grant, Link
from fabricd.transport.sender import Backoff


def _link() -> Link:
    return Link(Backoff(0.5, 30.0, random.Random(7)))


def test_up_link_lets_every_batch_through() -> None:
    link = _link()
    assert link.claim(0.0) is Grant.SEND
    assert link.claim(0.0) is Grant.SEND


def test_after_a_failure_batches_are_spooled_until_the_backoff_then_one_probe_goes() -> None:
    link = _link()
    assert link.failed(Grant.SEND, now=10.0, reason="refused", retry_after=None) is True
    due = link.retry_at
    assert link.wait_seconds(10.0) == due - 10.0
    assert 10.0 <= due <= 10.5  # first delay is U(0, initial)
    assert link.claim(due - 0.001) is None
    assert link.claim(due) is Grant.PROBE
    assert link.claim(due + 100) is None  # the probe is still in flight: nobody else goes
    assert link.wait_seconds(due + 100) is None  # until its answer arrives


def test_retry_after_from_the_server_sets_the_next_probe() -> None:
    link = _link()
    link.failed(Grant.SEND, now=0.0, reason="HTTP 429", retry_after=7.0)
    assert link.claim(6.99) is None
    assert link.claim(7.0) is Grant.PROBE


def test_concurrent_failures_do_not_inflate_the_backoff() -> None:
    link = _link()
    link.failed(Grant.SEND, now=0.0, reason="refused", retry_after=None)
    attempts = link.backoff.attempt
    assert link.failed(Grant.SEND, now=0.0, reason="refused", retry_after=None) is False
    assert link.backoff.attempt == attempts


def test_success_ends_the_outage_and_resets_the_backoff() -> None:
    link = _link()
    link.failed(Grant.SEND, now=0.0, reason="refused", retry_after=None)
    link.failed(Grant.PROBE, now=1.0, reason="refused", retry_after=None)
    assert link.succeeded() is True
    assert link.up and link.backoff.attempt == 0
    assert link.succeeded() is False
