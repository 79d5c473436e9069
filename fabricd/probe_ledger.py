"""The pingmesh prober's accounting: each peer's probes sent, received, lost, late and dropped by
this host, and the interval's RTT quantiles (pure: times are passed in; ``fabricd.probe`` does the
socket I/O)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from hdrh.histogram import HdrHistogram

HIST_MAX_US = 60_000_000  # RTTs above 60 s are clamped (a probe times out long before)
# 2 significant digits: quantiles within 1 %, which is finer than RTT jitter; 3 digits made the
# pure-Python histogram 4x slower to query and reset, ~2-5 ms per peer per scrape on the agent's
# event loop (the loop that also answers probes).
HIST_DIGITS = 2
EXPIRED_KEEP = 65536  # how many timed-out sequence numbers to remember for late-reply accounting


@dataclass(frozen=True, slots=True)
class RttSummary:
    """RTT over one collect interval, in seconds."""

    count: int
    min: float
    p50: float
    p90: float
    p99: float
    max: float


@dataclass(frozen=True, slots=True)
class PeerCounts:
    """Cumulative since the prober started: sent = received + lost + host_dropped + in flight."""

    sent: int
    received: int
    lost: int
    late: int
    out_of_order: int
    duplicate: int
    in_flight: int
    host_dropped: int = 0  # unanswered, but this host may have dropped them itself (``Ledger``)


class Ledger:
    """Exact per-peer accounting of probes, from sequence numbers and times passed in (pure).

    A probe is received once (duplicates ignored), lost once when its timeout passes, and a reply
    that arrives after that is counted as ``late`` only, never also as received. ``out_of_order``
    counts replies whose sequence number is below the highest one already received.

    A probe this host could not send, or one in flight when the prober's socket dropped datagrams
    (``on_host_drop``) and then unanswered, is ``host_dropped``, not lost: its reply may be one the
    socket dropped, and which ones those were the kernel does not say. In such a window a probe the
    network lost is counted so too: the prober under-counts the fabric's loss while its own host
    drops, rather than blame the fabric for the host (``fabricd.udpstamp``).
    """

    def __init__(self, timeout_ns: int) -> None:
        self.timeout_ns = timeout_ns
        self.outstanding: OrderedDict[int, int] = OrderedDict()  # seq -> send time (ns), in send order
        self.expired: OrderedDict[int, bool] = OrderedDict()  # seq -> whether it was counted lost
        self.sent = self.received = self.lost = self.late = self.out_of_order = self.duplicate = 0
        self.host_dropped = 0
        self.suspect_upto = -1  # probes up to this seq were in flight when the host dropped replies
        self.highest = -1
        self.hist = HdrHistogram(1, HIST_MAX_US, HIST_DIGITS)
        self.rtt_min_ns: int | None = None
        self.rtt_max_ns = 0

    def on_send(self, seq: int, now_ns: int) -> None:
        self.sent += 1
        self.outstanding[seq] = now_ns

    def on_unsent(self, seq: int) -> None:
        """The probe ``on_send`` counted did not leave this host (a full socket buffer)."""
        if self.outstanding.pop(seq, None) is not None:
            self.host_dropped += 1

    def on_host_drop(self) -> None:
        """The prober's socket dropped datagrams: any probe in flight now may have lost its reply there."""
        if self.outstanding:
            self.suspect_upto = next(reversed(self.outstanding))

    def on_reply(self, seq: int, now_ns: int, arrival_ns: int | None = None) -> None:
        """A reply read at ``now_ns`` that reached the host at ``arrival_ns`` (the kernel's stamp;
        None: unknown, taken as ``now_ns``).

        On time means it *arrived* within the timeout: a prober whose event loop stalled reads
        late the replies that came meanwhile, and must not count them lost. Its RTT is the read
        time's, on which the delay detectors' thresholds were measured (docs/latency.md), except
        for a reply read after its timeout had passed: that one is timed at its arrival (the
        stall is the prober's, not the path's)."""
        arrived = now_ns if arrival_ns is None else min(arrival_ns, now_ns)
        self.expire(arrived)
        sent_ns = self.outstanding.pop(seq, None)
        if sent_ns is None:
            self._unexpected(seq)
            return
        self.received += 1
        if seq < self.highest:
            self.out_of_order += 1
        self.highest = max(self.highest, seq)
        rtt_ns = now_ns - sent_ns
        self._record(rtt_ns if rtt_ns < self.timeout_ns else arrived - sent_ns)

    def _unexpected(self, seq: int) -> None:
        if seq in self.expired:  # forgotten once heard: a second copy is a duplicate, not late again
            if self.expired.pop(seq):  # counted lost: late takes the loss back (``loss_ratio``)
                self.late += 1  # (a host-dropped probe's late reply has no loss to take back)
        else:
            self.duplicate += 1

    def _record(self, rtt_ns: int) -> None:
        self.hist.record_value(min(HIST_MAX_US, max(1, round(rtt_ns / 1000))))
        self.rtt_min_ns = rtt_ns if self.rtt_min_ns is None else min(self.rtt_min_ns, rtt_ns)
        self.rtt_max_ns = max(self.rtt_max_ns, rtt_ns)

    def expire(self, now_ns: int) -> None:
        while self.outstanding:
            seq, sent_ns = next(iter(self.outstanding.items()))
            if now_ns - sent_ns < self.timeout_ns:
                return  # send order = time order: the rest are younger
            del self.outstanding[seq]
            lost = seq > self.suspect_upto
            if lost:
                self.lost += 1
            else:
                self.host_dropped += 1
            self.expired[seq] = lost
            if len(self.expired) > EXPIRED_KEEP:
                self.expired.popitem(last=False)

    def counts(self) -> PeerCounts:
        return PeerCounts(
            self.sent,
            self.received,
            self.lost,
            self.late,
            self.out_of_order,
            self.duplicate,
            len(self.outstanding),
            self.host_dropped,
        )

    def take_rtt(self) -> RttSummary | None:
        """The interval's RTT summary, and a fresh interval; None when nothing came back."""
        count = self.hist.get_total_count()
        if not count or self.rtt_min_ns is None:
            return None
        pct = self.hist.get_percentile_to_value_dict([50, 90, 99])  # one pass over the buckets
        lo, hi = self.rtt_min_ns / 1e9, self.rtt_max_ns / 1e9
        # The histogram answers a bucket's highest value, up to 1/128 over the sample at 2 digits (a
        # p99 of 1343 us beside a 1340.9 us max); clamped, the five gauges stay ordered.
        p50, p90, p99 = (min(hi, max(lo, pct[q] / 1e6)) for q in (50, 90, 99))
        summary = RttSummary(count, lo, p50, p90, p99, hi)
        self.hist.reset()
        self.rtt_min_ns, self.rtt_max_ns = None, 0
        return summary
