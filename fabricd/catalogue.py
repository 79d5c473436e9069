"""The metric catalogue: every family fabricd exposes, with its type, unit, help and labels.

One table (``CATALOGUE``), read by the exposition (HELP text), by ``docs/prometheus.md`` and by the
tests, which check it against what the real collectors, the central service and the agent emit, and
that every metric a rule or dashboard uses is listed here. Counters are listed by their exposed name
(``..._total``); every sample counter has a ``..._per_second`` gauge with the agent-computed rate.

Raw statistics that fabricd passes through without a neutral name (ethtool ``include_unmapped``,
hw_counters of drivers it does not know) are covered by ``pattern`` rows: their names come from the
hardware, their type and labels do not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from fabricd import signal_table as table
from fabricd.drivers import ethtool as eth
from fabricd.drivers import ib
from fabricd.drivers.ib import pma
from fabricd.drivers.vocabulary import PORT as PORT_ATTRIBUTES
from fabricd.drivers.vocabulary import VOCABULARY, Term
from fabricd.model import Kind
from fabricd.naming import metric_stem

IB_SOURCE = "infiniband"
MEASURED = frozenset({"bytes", "seconds", "ticks", "ratio"})  # units a name carries (fabricd.naming)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # as exposed; a regex when ``pattern``
    type: str  # counter | gauge | histogram
    unit: str  # base unit ("" for counts and levels)
    help: str
    labels: tuple[str, ...]  # on every series
    optional: tuple[str, ...] = ()  # on some series only
    pattern: bool = False

    def matches(self, name: str) -> bool:
        return re.fullmatch(self.name, name) is not None if self.pattern else name == self.name


PORT = ("node", "device", "port")
IFACE = ("node", "device")
PRIO = ("node", "device", "priority")
QDISC = ("node", "device", "qdisc", "handle", "parent")


def _counter(
    name: str, unit: str, help: str, labels: tuple[str, ...], optional: tuple[str, ...] = (), pattern: bool = False
) -> tuple[MetricSpec, MetricSpec]:
    rate_unit = f"{unit}/s" if unit else "1/s"
    rate_help = f"Per-second rate (agent-computed): {help[0].lower()}{help[1:]}"
    return (
        MetricSpec(f"{name}_total", "counter", unit, help, labels, optional, pattern),
        MetricSpec(f"{name}_per_second", "gauge", rate_unit, rate_help, labels, optional, pattern),
    )


def _gauge(
    name: str, unit: str, help: str, labels: tuple[str, ...], optional: tuple[str, ...] = ()
) -> tuple[MetricSpec]:
    return (MetricSpec(name, "gauge", unit, help, labels, optional),)


def _rows(*groups: tuple[MetricSpec, ...]) -> tuple[MetricSpec, ...]:
    return tuple(spec for group in groups for spec in group)


def _unit(term: Term) -> str:
    """The catalogue's unit: base units of measurement; counts of things have none."""
    return {"bytes_per_second": "bytes/s"}.get(term.unit, term.unit if term.unit in MEASURED else "")


def _term(source: str, term: Term, labels: tuple[str, ...], optional: tuple[str, ...] = ()) -> tuple[MetricSpec, ...]:
    """The families of one neutral name as ``source`` exposes it (``fabricd.naming``)."""
    stem = metric_stem(source, term.name, term.unit)
    if term.kind is Kind.GAUGE:
        return _gauge(stem, _unit(term), term.meaning, labels, optional)
    return _counter(stem, _unit(term), term.meaning, labels, optional)


def _ib_rows() -> tuple[MetricSpec, ...]:
    """counters/ rows per port; hw_counters/ rows of every driver table, per device or port."""
    pma_terms = dict.fromkeys(c.name for c in (*pma.COUNTERS.values(), *pma.EXT.values()))
    hw_terms = dict.fromkeys(c.name for d in ib.drivers() for c in d.counters)
    return _rows(
        *(_term(IB_SOURCE, VOCABULARY[n], PORT) for n in pma_terms),
        *(_term(IB_SOURCE, VOCABULARY[n], ("node", "device"), ("port",)) for n in hw_terms),
        *(_term(IB_SOURCE, t, PORT) for t in PORT_ATTRIBUTES),
    )


def _ethtool_rows() -> tuple[MetricSpec, ...]:
    """One family per neutral name the ethtool tables use; per priority when any rule gives one."""
    per_priority: dict[str, bool] = {}
    for rule in (r for d in eth.drivers() for r in d.rules):
        per_priority[rule.name] = per_priority.get(rule.name, False) or rule.priority is not None
    return _rows(*(_term("ethtool", VOCABULARY[n], PRIO if p else IFACE) for n, p in per_priority.items()))


def _derived_rows() -> tuple[MetricSpec, ...]:
    rows = (s for s in table.SIGNALS if s.agent)
    return _rows(
        *(
            _gauge(metric_stem("derived", s.name, s.unit), _RATES.get(s.unit, ""), s.help, s.labels, s.optional_labels)
            for s in rows
        )
    )


_RATES = {"ratio": "ratio", "bytes_per_second": "bytes/s", "packets_per_second": "packets/s", "per_second": "1/s"}
IB = "fabricd_infiniband_"
ETH = "fabricd_ethtool_"
NL = "fabricd_netlink_"
_NL_LINK = (
    ("rx_bytes", "bytes", "Bytes received (rtnl_link_stats64)"),
    ("tx_bytes", "bytes", "Bytes sent"),
    ("rx_packets", "", "Packets received"),
    ("tx_packets", "", "Packets sent"),
    ("rx_errors", "", "Receive errors"),
    ("tx_errors", "", "Transmit errors"),
    ("rx_dropped", "", "Received packets dropped"),
    ("tx_dropped", "", "Transmit packets dropped"),
    ("rx_missed_errors", "", "Packets missed by the NIC (ring full)"),
    ("rx_crc_errors", "", "Received frames with a CRC error"),
    ("rx_fifo_errors", "", "Receive FIFO overruns"),
    ("tx_fifo_errors", "", "Transmit FIFO errors"),
    ("rx_over_errors", "", "Receive ring overflows"),
    ("rx_frame_errors", "", "Frame alignment errors"),
    ("rx_length_errors", "", "Length errors"),
    ("tx_carrier_errors", "", "Carrier errors"),
    ("collisions", "", "Collisions"),
    ("multicast", "", "Multicast packets received"),
    ("rx_nohandler", "", "Packets dropped for lack of a protocol handler"),
    ("carrier_changes", "", "Carrier up/down transitions (link flaps)"),
)
_NL_QDISC = (
    ("qdisc_bytes", "bytes", "Bytes sent by the qdisc"),
    ("qdisc_packets", "", "Packets sent by the qdisc"),
    ("qdisc_drops", "", "Packets dropped by the qdisc (queue full)"),
    ("qdisc_overlimits", "", "Times the qdisc was over its limit (shaping or queue full)"),
    ("qdisc_requeues", "", "Packets requeued"),
)

PM = "fabricd_pingmesh_"
_PM_COUNTERS = (
    ("probes_sent", "Probes sent to the peer"),
    ("probes_received", "Probe replies received in time"),
    ("probes_lost", "Probes with no reply within the timeout (loss)"),
    ("probes_late", "Replies that arrived after the timeout (counted as lost once)"),
    ("probes_out_of_order", "Replies received out of sequence order"),
)

NC = "fabricd_nccl_"
NCCL_ROW = ("node", "op", "size", "placement")
NCCL_RUN = ("node", "op")


SELF_NODE_COLLECTOR = ("node", "collector")

CATALOGUE: tuple[MetricSpec, ...] = _rows(
    # --- infiniband collector (tables: fabricd/drivers/ib/) ---
    _ib_rows(),
    _counter(
        IB + r"[a-z_][a-z0-9_]*",
        "",
        "A hw_counters/ counter of a driver fabricd has no name for (raw name)",
        ("node", "device"),
        ("port",),
        pattern=True,
    ),
    _gauge(
        IB + "device_info",
        "",
        "HCA attributes (value 1)",
        ("node", "device"),
        ("firmware_version", "board_id", "hca_type", "node_guid"),
    ),
    _gauge(
        IB + "port_info", "", "Port link layer and state names (value 1)", PORT, ("link_layer", "state", "phys_state")
    ),
    # --- ethtool collector (tables: fabricd/drivers/ethtool/) ---
    _ethtool_rows(),
    _counter(
        ETH + r"[a-z_][a-z0-9_]*",
        "",
        "An ethtool -S statistic without a neutral name (raw name; only with include_unmapped or include_queues)",
        IFACE,
        pattern=True,
    ),
    _gauge(ETH + "link_speed_bytes_per_second", "bytes/s", "Negotiated link speed", IFACE),
    _gauge(ETH + "link_detected", "", "1 if the link is detected (ethtool link status)", IFACE),
    _gauge(
        ETH + "driver_info",
        "",
        "NIC driver attributes (value 1)",
        IFACE,
        ("driver", "version", "firmware_version", "bus_info"),
    ),
    # --- netlink collector ---
    *(_counter(NL + n, u, h, IFACE) for n, u, h in _NL_LINK),
    *(_counter(NL + n, u, h, QDISC) for n, u, h in _NL_QDISC),
    _gauge(NL + "qdisc_backlog_bytes", "bytes", "Bytes queued in the qdisc now", QDISC),
    _gauge(NL + "qdisc_backlog_packets", "", "Packets queued in the qdisc now", QDISC),
    # --- pingmesh collector (peer = the probed node) ---
    *(_counter(PM + n, "", h, ("node", "peer")) for n, h in _PM_COUNTERS),
    *(
        _gauge(PM + f"rtt_{q}_seconds", "seconds", f"Round-trip time {q} over the last interval", ("node", "peer"))
        for q in ("min", "p50", "p90", "p99", "max")
    ),
    # --- nccl collector (op = the collective, e.g. all_reduce) ---
    _gauge(
        NC + "time_seconds",
        "seconds",
        "Time of one collective at this size (NCCL-tests time column)",
        NCCL_ROW,
        ("root",),
    ),
    _gauge(NC + "algbw_bytes_per_second", "bytes/s", "Algorithm bandwidth at this size", NCCL_ROW, ("root",)),
    _gauge(
        NC + "busbw_bytes_per_second",
        "bytes/s",
        "Bus bandwidth at this size (comparable across ops)",
        NCCL_ROW,
        ("root",),
    ),
    _gauge(NC + "wrong_elements", "", "Wrong elements reported (#wrong; must be 0)", NCCL_ROW, ("root",)),
    _gauge(NC + "avg_busbw_bytes_per_second", "bytes/s", "Average bus bandwidth of the last run", NCCL_RUN),
    _gauge(NC + "out_of_bounds_values", "", "Out-of-bounds values of the last run", NCCL_RUN),
    _gauge(NC + "run_success", "", "1 if the last run completed without error", NCCL_RUN),
    _gauge(NC + "run_duration_seconds", "seconds", "Wall time of the last run", NCCL_RUN),
    _gauge(
        NC + "run_failed_last_timestamp_seconds", "seconds", "When a run last failed, by reason", NCCL_RUN, ("reason",)
    ),
    _counter(NC + "runs_skipped", "", "Runs not started because the previous one was still running", NCCL_RUN),
    _gauge(
        NC + "nodes", "", "Nodes of the last run's job (distinct hosts of its ranks, or the nodes option)", NCCL_RUN
    ),
    _gauge(NC + "ranks", "", "Ranks (GPUs) of the last run's job", NCCL_RUN),
    _gauge(
        NC + "model_efficiency_ratio",
        "ratio",
        "Achievable fraction of line rate the performance model "
        "assumes for this job (option model_efficiency, else the model default), by algorithm",
        (*NCCL_RUN, "algo"),
    ),
    # --- derived signals (computed at the agent from one scrape's rates: fabricd/signal_table.py) ---
    _derived_rows(),
    # --- counter semantics ---
    _gauge(
        "fabricd_saturated_since_timestamp_seconds",
        "seconds",
        "Since when a counter has been clamped at "
        "all ones (its rate is unknown since then, not 0); absent when not saturated",
        ("node", "source", "device", "counter"),
        ("port", "priority"),
    ),
    # --- exporter ---
    (
        MetricSpec(
            "fabricd_exporter_series_refused_total",
            "counter",
            "",
            "Series left out of /metrics, by family and reason (family_cap, label_too_long, type_conflict)",
            ("family", "reason"),
        ),
    ),
    # --- central service (fabricd/server/metrics.py) ---
    _gauge("fabricd_store_up", "", "1 if the fleet view could be read from the database", ()),
    _gauge(
        "fabricd_agent_last_seen_timestamp_seconds",
        "seconds",
        "When the central last accepted a batch from the node's agent",
        ("node",),
    ),
    _gauge("fabricd_agent_info", "", "Agent version per node (value 1)", ("node", "version")),
    _gauge("fabricd_collector_success", "", "1 if the collector's last run succeeded", ("collector",), ("node",)),
    _gauge(
        "fabricd_collector_duration_seconds",
        "seconds",
        "Duration of the collector's last run",
        ("collector",),
        ("node",),
    ),
    _gauge("fabricd_incidents_open", "", "Incidents not yet resolved (open or acknowledged)", ("kind", "severity")),
    (
        MetricSpec("fabricd_ingest_batches_total", "counter", "", "Batches accepted and stored", ()),
        MetricSpec("fabricd_ingest_samples_total", "counter", "", "Samples accepted and stored", ()),
        MetricSpec("fabricd_ingest_rejected_batches_total", "counter", "", "Batches refused, by reason", ("reason",)),
        MetricSpec("fabricd_ingest_duplicate_batches_total", "counter", "", "Retried batches acknowledged again", ()),
        MetricSpec("fabricd_ingest_series_created_total", "counter", "", "New series stored", ()),
        MetricSpec(
            "fabricd_ingest_duration_seconds", "histogram", "seconds", "Time to decode, check and store one batch", ()
        ),
        MetricSpec("fabricd_detection_errors_total", "counter", "", "Detector runs that raised", ()),
        MetricSpec("fabricd_store_deleted_points_total", "counter", "", "Points deleted past retention", ()),
        MetricSpec(
            "fabricd_store_downsampled_points_total", "counter", "", "Raw points folded into downsampled buckets", ()
        ),
        MetricSpec(
            "fabricd_store_latest_flushed_series_total",
            "counter",
            "",
            "Series rows whose latest value was written to the database",
            (),
        ),
        MetricSpec(
            "fabricd_store_latest_flush_errors_total",
            "counter",
            "",
            "Writes of latest values that failed (kept in memory and retried)",
            (),
        ),
        MetricSpec(
            "fabricd_store_latest_flush_duration_seconds",
            "histogram",
            "seconds",
            "Time to write the latest values changed since the previous write",
            (),
        ),
    ),
    _gauge(
        "fabricd_store_latest_unflushed_series",
        "",
        "Series whose latest value is in memory only (written every latest_flush_seconds)",
        (),
    ),
    _gauge(
        "fabricd_detection_lag_seconds",
        "seconds",
        "Wall time minus the event time of the newest sample the detectors processed",
        (),
    ),
    _gauge("fabricd_detection_backlog_points", "", "Stored points the detectors have not processed yet", ()),
    # --- alert hooks (fabricd/hooks) ---
    (
        MetricSpec(
            "fabricd_hook_notifications_total",
            "counter",
            "",
            "Incident notifications by hook and outcome (delivered, retried, failed, dropped)",
            ("hook", "outcome"),
        ),
    ),
    _gauge("fabricd_hook_queue_depth", "", "Notifications waiting per hook", ("hook",)),
    # --- agent transport (fabricd/transport/metrics.py; the agent's own /metrics) ---
    (
        MetricSpec(
            "fabricd_agent_batches_sent_total", "counter", "", "Batches acknowledged by the central service", ()
        ),
        MetricSpec(
            "fabricd_agent_batches_retried_total",
            "counter",
            "",
            "Send attempts of batches that had failed once or were spooled",
            (),
        ),
        MetricSpec("fabricd_agent_batches_spooled_total", "counter", "", "Batches written to the on-disk spool", ()),
        MetricSpec("fabricd_agent_batches_dropped_total", "counter", "", "Batches given up on, by reason", ("reason",)),
        MetricSpec(
            "fabricd_agent_spool_quarantined_total", "counter", "", "Spool files quarantined (corrupt or rejected)", ()
        ),
        MetricSpec("fabricd_agent_send_duration_seconds", "histogram", "seconds", "Duration of one send attempt", ()),
    ),
    _gauge("fabricd_agent_spool_bytes", "bytes", "Bytes held in the agent's spool", ()),
    _gauge("fabricd_agent_spool_batches", "", "Batches held in the agent's spool", ()),
    _gauge("fabricd_agent_central_up", "", "1 while the last send to the central service succeeded", ()),
    _gauge(
        "fabricd_agent_last_successful_send_timestamp_seconds",
        "seconds",
        "When the central last acknowledged a batch from this agent",
        (),
    ),
)


@cache
def _exact() -> dict[str, MetricSpec]:
    return {m.name: m for m in CATALOGUE if not m.pattern}


def lookup(name: str) -> MetricSpec | None:
    """The row for an exposed name: an exact row first, else the first pattern that matches."""
    found = _exact().get(name)
    if found is not None:
        return found
    return next((m for m in CATALOGUE if m.pattern and m.matches(name)), None)


def help_for(name: str) -> str:
    """HELP text for an exposed name ("" when only a pattern row or nothing covers it)."""
    found = _exact().get(name)
    return found.help if found is not None else ""
