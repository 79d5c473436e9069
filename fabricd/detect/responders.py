"""Probes to a node whose responder was not running are unanswerable, not lost.

A pingmesh pair ``(prober, peer)`` loses every probe sent while the peer's agent is down: the
agent answers the probes itself (``collectors/pingmesh.py``), so a restart (an upgrade, "a slice at a
time", docs/operations.md; a crash and its restart) or the fleet's start leaves its peers' probes
unanswered for the seconds the process takes to come back. Counted as loss, every pair to that node
lost 10-30 % of a scrape's probes at once, and ``packet_loss`` (or ``link_flap``, the per-scrape
outage rule) opened on the healthy host link of each restarted node. The peer's agent reports when
its responder began answering (``responder_start_time_seconds``); a scrape of a pair that reaches
back before that start, and after the previous instance was last heard, says nothing about the
fabric, and its loss is not observed (its RTTs, from the probes that were answered, still are).

The responder start is wall time on the peer and a scrape's time is the prober's: both are event
times, NTP-synchronized as settlement assumes (``fabricd.detect.settle``). A probe is reported lost
after its timeout and the settling after it (1 s and at most 2 s by default), so a scrape up to that
much past the start can still hold probes sent before it; ``MARGIN_SECONDS`` covers that with a
second to spare.

A pair that has lost every probe since its prober first reported it was never answered: no
responder there yet (a peer whose agent has not started, at the fleet's start, before it reports its
start), or none at all (a name that does not answer). That is reachability, not loss, which drops a
share of the probes of a path that answers the rest: its loss counts from the first scrape with a
reply. A pair that was answered and then loses everything is an outage (``probe_outage``) and
counts. The answered pairs live in memory: after the central's restart a pair is judged again from
its first answered scrape.

A peer that settlement left out of the moment (its agent unheard past the lateness,
``fabricd.detect.settle``) is ``silent``: the pairs to it are not observed while it is. Its agent
may be down, responder and all, and until it is heard again nothing says whether a new instance
began (an agent restarted slower than the lateness: its start arrives after its peers' losses were
judged, and packet_loss opened on its healthy host link) or the old one is still answering (only
its delivery to the central is cut, as the management network is not the fabric). A node that
never comes back is a dead host or agent, reported as left out (``fabricd_detection_node_left_out``),
not a lossy host link; its own counters, spooled, speak for its link once it delivers them.

A peer back within the lateness but a scrape late is not left out, yet the moment of its missed
scrape settles with its probers' losses before its next scrape brings its new start (the routed
lab's quick restart under CI's load opened packet_loss so). A loss therefore waits until its peer
has reported a scrape of its time (``WAIT_SECONDS`` at most), whose start then says whether the
responder ran throughout.

A responder whose host dropped requests (its socket's queue full: the agent stalled; its
``responder_socket_drops`` counter rose, ``fabricd.udpstamp``) left its probers' probes unanswered
the same way, and one that held requests past ``fabricd.probe.HELD_LATE_NS`` (its
``responder_late_answers`` rose) answered them past its probers' timeouts, maybe after their
settling too: a stall of more than the timeout and the settling together puts the loss in one
scrape and the late reply in the next, where no per-scrape ratio takes it back. Its probers cannot
tell which of their probes those were: a scrape of a pair whose peer missed so within its probes'
time (``MARGIN_SECONDS`` before the scrape's start to its end) is not observed either. Measured: a
leaf-spine lab run on two cores busy with the rest of the test suite opened ``packet_loss`` on a
healthy host link beside the real fault, every pair to that host lost probes at once, its own
leaf's among them (tests/test_leafspine_lab.py, 2026-12-07). The prober's own socket's drops never
reach this far: its agent counts those probes as ``probes_host_dropped``, not lost
(``fabricd.probe_ledger.Ledger``).

Order: a moment's samples are absorbed node by node, so a prober's loss may come before its peer's
start in the same moment. Loss observations are held until the moment's records are all read
(``hold``, ``release``). A peer whose agent has never reported (a node without fabricd, or one whose
agent starts more than a scrape after its probers') is not known to be down: once its pairs have
been answered, their loss counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fabricd.model import Labels

RESPONDER_START = "responder_start_time_seconds"  # the pingmesh gauge (collectors/pingmesh.py)
RESPONDER_DROPS = "responder_socket_drops"  # the pingmesh counters (their rates, per second)
RESPONDER_LATE = "responder_late_answers"
MISSES = (RESPONDER_DROPS, RESPONDER_LATE)  # requests its host dropped, or held late
REPORTS = (RESPONDER_START, *MISSES)  # what an agent says of its responder
MARGIN_SECONDS = 4.0  # a probe's timeout (1 s) and the settling before it is reported lost (<= 2 s), + 1 s
NEVER = float("-inf")
# How long a loss waits for its peer's scrape of its time: past settlement's lateness (0.5 x the
# interval + 5 s, so intervals up to 110 s), after which the peer is heard or left out. A peer heard
# of that stopped reporting its responder start (pingmesh turned off) has its pairs judged on what
# is known.
WAIT_SECONDS = 60.0

Observe = Callable[[str, str, str, str, Labels, float, float], None]  # (signal, node, device, port, labels, ts, v)


@dataclass(slots=True)
class _Peer:
    start: float  # when the responder now running began answering (the peer's clock)
    absent_from: float  # last heard of the instance before it (NEVER: none known)
    last_ts: float  # the newest scrape that reported ``start``


@dataclass(slots=True)
class Responders:
    """Each node's responder start, and the loss observations of one moment until it is read."""

    peers: dict[str, _Peer] = field(default_factory=dict)
    held: list[tuple[str, str, str, Labels, float, float, float]] = field(default_factory=list)
    scraped: dict[tuple[str, str], float] = field(default_factory=dict)  # (prober, peer) -> its last loss scrape
    answered: set[tuple[str, str]] = field(default_factory=set)  # pairs with a reply seen in some scrape
    silent: frozenset[str] = frozenset()  # nodes left out of the moment being read (the module's doc)
    newest: float = NEVER  # the newest loss scrape held: the clock of the waits
    # (node, counter) -> the (previous scrape, scrape] spans in which its responder missed requests
    # (dropped, or held late): each counter's own scrapes give its spans
    misses: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    misses_read: dict[tuple[str, str], float] = field(default_factory=dict)  # -> its last scrape

    def report(self, name: str, node: str, ts: float, value: float) -> None:
        """One of ``REPORTS`` from ``node``'s scrape at ``ts``."""
        if name == RESPONDER_START:
            self.started(node, ts, value)
        else:
            self.missed(node, name, ts, value)

    def started(self, node: str, ts: float, start: float) -> None:
        """``node``'s scrape at ``ts`` says its responder has answered since ``start``."""
        peer = self.peers.get(node)
        if peer is None:
            self.peers[node] = _Peer(start, NEVER, ts)
        elif start > peer.start:  # a new instance: down since its predecessor was last heard
            self.peers[node] = _Peer(start, peer.last_ts, ts)
        else:
            peer.last_ts = max(peer.last_ts, ts)

    def missed(self, node: str, counter: str, ts: float, per_second: float) -> None:
        """``node``'s scrape at ``ts`` read its responder's ``counter`` (requests dropped, or held
        late) rising at ``per_second``."""
        key = (node, counter)
        since = self.misses_read.get(key, NEVER)
        self.misses_read[key] = max(since, ts)
        if since >= ts:
            since = NEVER  # a scrape read out of order: its span is not known, any time before it
        if per_second > 0:
            spans = self.misses.setdefault(key, [])
            spans.append((since, ts))
            horizon = ts - 2 * WAIT_SECONDS  # older than any held loss's scrape can reach back
            if spans[0][1] < horizon:
                spans[:] = [span for span in spans if span[1] >= horizon]

    def unanswerable(self, peer: str, since: float, ts: float) -> bool:
        """Whether the scrape of a pair to ``peer`` covering ``(since, ts]`` may hold probes sent
        while ``peer``'s responder was not running, or that its host dropped or held late."""
        p = self.peers.get(peer)
        if p is not None and ts > p.absent_from and since < p.start + MARGIN_SECONDS:
            return True
        return any(
            a < ts and b > since - MARGIN_SECONDS for counter in MISSES for a, b in self.misses.get((peer, counter), ())
        )

    def says_nothing(self, pair: tuple[str, str]) -> bool:
        """Whether a probed pair says nothing of its path, so that it neither clears an element nor
        counts among the probed pairs: it has reported loss but has never been answered (no
        responder there: the fleet's start, a name that does not answer), and was counted healthy.
        A pair to a ``silent`` peer still counts: the central catching up on a backlog settles its
        moments with most of the fleet left out (processing time far past event time), and
        counting none of their pairs moved a congested link's incident onto its leaf
        (tests/test_cli_incident.py replays a stored run so)."""
        return pair in self.scraped and pair not in self.answered

    def hold(self, node: str, peer: str, port: str, labels: Labels, ts: float, value: float) -> None:
        """A pair's loss ratio for its scrape at ``ts`` (since its previous one), observed at ``release``."""
        since = self.scraped.get((node, peer), NEVER)
        self.scraped[(node, peer)] = max(since, ts)
        self.newest = max(self.newest, ts)
        self.held.append((node, peer, port, labels, since, ts, value))

    def release(self, signal: str, observe: Observe) -> None:
        """Observe the held losses of pairs whose peer was answering throughout their scrape, once
        the pair has been answered at all and while the peer is heard from. A loss whose peer has
        not reported a scrape of its time yet waits for it (at most ``WAIT_SECONDS``): the peer's
        agent may have restarted in between, and its next scrape says so (the module's doc)."""
        held, self.held = self.held, []
        silent, newest = self.silent, self.newest
        for entry in held:
            node, peer, port, labels, since, ts, value = entry
            if value < 1.0:
                self.answered.add((node, peer))
            elif (node, peer) not in self.answered:
                continue  # never answered yet: no responder there, not loss
            if peer in silent:
                continue
            p = self.peers.get(peer)
            if p is not None and p.last_ts < ts and newest - ts < WAIT_SECONDS:
                self.held.append(entry)
                continue
            if not self.unanswerable(peer, since, ts):
                observe(signal, node, peer, port, labels, ts, value)
