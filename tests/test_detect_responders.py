"""``fabricd.detect.responders``: which pair scrapes reach back to a time their peer's responder was
not running (the fleet's start, an agent's restart), and the loss observations held for a moment."""

from __future__ import annotations

from fabricd.detect.responders import MARGIN_SECONDS, Responders
from fabricd.model import Labels


def test_a_peer_first_heard_was_down_before_its_start_and_not_after_the_margin() -> None:
    r = Responders()
    r.started("b", ts=100.0, start=98.0)  # the fleet's start: b's agent came up at 98
    assert r.unanswerable("b", since=90.0, ts=100.0)  # probes sent before 98
    assert r.unanswerable("b", since=100.0, ts=110.0)  # probes sent up to 98, reported after their timeout
    assert not r.unanswerable("b", since=98.0 + MARGIN_SECONDS, ts=110.0)
    assert not r.unanswerable("c", since=90.0, ts=100.0)  # never heard of: its losses count


def test_a_restart_covers_from_the_old_instance_last_heard_to_the_new_start() -> None:
    r = Responders()
    for ts in (100.0, 110.0, 120.0):
        r.started("b", ts=ts, start=10.0)  # up since long ago
    assert not r.unanswerable("b", since=110.0, ts=120.0)
    r.started("b", ts=130.0, start=127.0)  # restarted between its scrapes at 120 and 130
    assert not r.unanswerable("b", since=110.0, ts=120.0)  # before it was last heard: answering
    assert r.unanswerable("b", since=120.0, ts=130.0)
    assert r.unanswerable("b", since=130.0, ts=140.0)  # 127 + the margin is past 130
    assert not r.unanswerable("b", since=140.0, ts=150.0)
    r.started("b", ts=140.0, start=127.0)  # the same instance again: nothing new
    assert not r.unanswerable("b", since=140.0, ts=150.0)


def test_losses_are_held_until_the_moment_is_read_and_only_answerable_ones_observed() -> None:
    r = Responders()
    seen: list[tuple[str, str, float, float]] = []

    def observe(signal: str, node: str, peer: str, port: str, labels: Labels, ts: float, value: float) -> None:
        seen.append((node, peer, ts, value))

    for ts in (100.0, 110.0):
        r.started("b", ts=ts, start=10.0)
        r.started("c", ts=ts, start=10.0)
        r.hold("a", "b", "", (), ts, 0.0)
        r.hold("a", "c", "", (), ts, 0.0)
        r.release("probe_loss_ratio", observe)
    seen.clear()
    r.hold("a", "b", "", (), 120.0, 0.3)  # a's scrape comes before b's in the moment
    r.hold("a", "c", "", (), 120.0, 0.02)
    r.started("b", ts=120.0, start=118.0)
    r.started("c", ts=120.0, start=10.0)
    r.release("probe_loss_ratio", observe)
    assert seen == [("a", "c", 120.0, 0.02)]
    assert r.held == []


def test_a_pair_never_answered_is_not_lossy_until_a_reply_came_and_then_an_outage_counts() -> None:
    """Every probe lost from the pair's first scrape on: no responder there yet (a peer reporting no
    start, as a node without fabricd), not loss; from its first answered scrape its loss counts, a
    whole scrape lost included (an outage)."""
    r = Responders()
    seen: list[tuple[float, float]] = []

    def observe(signal: str, node: str, peer: str, port: str, labels: Labels, ts: float, value: float) -> None:
        seen.append((ts, value))

    for ts, value in ((100.0, 1.0), (110.0, 1.0), (120.0, 0.4), (130.0, 0.0), (140.0, 1.0)):
        r.hold("a", "x", "", (), ts, value)
        r.release("probe_loss_ratio", observe)
    assert seen == [(120.0, 0.4), (130.0, 0.0), (140.0, 1.0)]


def test_a_pair_never_answered_says_nothing_of_its_path_and_a_silent_peer_still_counts() -> None:
    r = Responders()

    def observe(signal: str, node: str, peer: str, port: str, labels: Labels, ts: float, value: float) -> None:
        pass

    r.hold("a", "b", "", (), 100.0, 0.0)  # answered
    r.hold("a", "c", "", (), 100.0, 1.0)  # never answered: no responder there
    r.release("probe_loss_ratio", observe)
    assert [r.says_nothing(p) for p in (("a", "b"), ("a", "c"), ("a", "d"))] == [False, True, False]
    r.silent = frozenset({"b"})  # left out of a moment: a central catching up leaves most out so
    assert not r.says_nothing(("a", "b"))
    r.hold("a", "c", "", (), 110.0, 0.5)  # answered at last
    r.release("probe_loss_ratio", observe)
    assert not r.says_nothing(("a", "c"))


def test_a_peer_whose_socket_dropped_requests_covers_its_scrape_span_and_the_margin_before() -> None:
    """b's responder socket dropped requests between its scrapes at 110 and 120: the pair scrapes
    whose probes may have reached b then (reported up to ``MARGIN_SECONDS`` after they were sent)
    say nothing; those before and well after count, and a scrape with no rise adds no span."""
    r = Responders()
    for ts, rate in ((100.0, 0.0), (110.0, 0.0), (120.0, 3.5), (130.0, 0.0)):
        r.report("responder_socket_drops", "b", ts, rate)
    assert r.misses == {("b", "responder_socket_drops"): [(110.0, 120.0)]}
    assert not r.unanswerable("b", since=100.0, ts=110.0)
    assert r.unanswerable("b", since=110.0, ts=120.0)
    assert r.unanswerable("b", since=120.0, ts=130.0)  # probes sent before 120, reported after
    assert not r.unanswerable("b", since=120.0 + MARGIN_SECONDS, ts=130.0)
    assert not r.unanswerable("c", since=110.0, ts=120.0)


def test_misses_in_the_first_scrape_heard_reach_back_to_any_time_before_it() -> None:
    """The central's first scrape of b (its start, b's agent long running) has a rate but no span."""
    r = Responders()
    r.report("responder_late_answers", "b", 100.0, 2.0)
    assert r.unanswerable("b", since=50.0, ts=60.0) and r.unanswerable("b", since=100.0, ts=110.0)
    assert not r.unanswerable("b", since=100.0 + MARGIN_SECONDS, ts=110.0)
