"""The agent's self-metrics: what an operator watches to know telemetry is not being lost.

Created in a registry passed in (never the global one at import), so two transports in one test
process, or the agent's own ``/metrics``, each see their own numbers.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Why a batch was given up on; every value is pre-created so dashboards see 0, not "no data".
DROP_REASONS = (
    "spool_full",  # spool at max_bytes: the oldest batch made room for a newer one
    "disk_full",  # ENOSPC while spooling: the batch could not be kept anywhere
    "spool_error",  # any other I/O error while spooling (read-only fs, permissions)
    "too_large",  # one batch bigger than the whole spool
    "corrupt",  # a spool file failed its length/crc check (quarantined)
    "rejected",  # the central answered a permanent 4xx (quarantined, server message logged)
    "invalid",  # the batch could not be encoded (e.g. a NaN with the JSON encoding); a bug, logged
)

# Send latency buckets: local central answers in ms, a loaded one in seconds, timeouts at 10 s.
_SEND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class TransportMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.sent = Counter(
            "fabricd_agent_batches_sent", "Batches acknowledged by the central service (200)", registry=registry
        )
        self.retried = Counter(
            "fabricd_agent_batches_retried",
            "Send attempts of batches that had already failed once or were spooled",
            registry=registry,
        )
        self.spooled = Counter(
            "fabricd_agent_batches_spooled", "Batches written to the on-disk spool", registry=registry
        )
        self.dropped = Counter(
            "fabricd_agent_batches_dropped", "Batches given up on, by reason", ["reason"], registry=registry
        )
        for reason in DROP_REASONS:
            self.dropped.labels(reason)
        self.quarantined = Counter(
            "fabricd_agent_spool_quarantined",
            "Batches moved to the spool's quarantine/ folder (corrupt or rejected)",
            registry=registry,
        )
        self.spool_bytes = Gauge("fabricd_agent_spool_bytes", "Bytes held in the spool", registry=registry)
        self.spool_batches = Gauge("fabricd_agent_spool_batches", "Batches held in the spool", registry=registry)
        self.central_up = Gauge(
            "fabricd_agent_central_up", "1 while the last send to the central service succeeded", registry=registry
        )
        self.last_success = Gauge(
            "fabricd_agent_last_successful_send_timestamp_seconds",
            "Wall-clock time of the last batch the central service acknowledged",
            registry=registry,
        )
        self.send_duration = Histogram(
            "fabricd_agent_send_duration_seconds",
            "Duration of one send attempt, any outcome",
            buckets=_SEND_BUCKETS,
            registry=registry,
        )

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped.labels(reason).inc(n)
