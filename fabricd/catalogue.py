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


IB = "fabricd_infiniband_"
_IB_PMA = (  # counters/ (kernel ABI sysfs-class-infiniband; IBA PortCounters, narrow ones saturate)
    ("symbol_errors", "", "Minor link errors detected on a physical lane (sysfs symbol_error)"),
    ("link_error_recovery", "", "Successful link error recovery procedures (link retrains)"),
    ("link_downed", "", "Times the link failed its error recovery and went down (a flap)"),
    ("port_receive_errors", "", "Received packets with errors (sysfs port_rcv_errors)"),
    ("port_receive_remote_physical_errors", "", "Received packets marked with the EBP delimiter"),
    ("port_receive_switch_relay_errors", "", "Received packets that could not be forwarded"),
    ("port_transmit_discards", "", "Outbound packets discarded (port down or congested)"),
    ("port_transmit_constraint_errors", "", "Outbound packets not sent due to partition/constraint checks"),
    ("port_receive_constraint_errors", "", "Inbound packets discarded due to partition/constraint checks"),
    ("local_link_integrity_errors", "", "Times local physical errors exceeded the threshold"),
    ("excessive_buffer_overrun_errors", "", "Consecutive flow-control update periods with buffer overrun"),
    ("vl15_dropped", "", "Incoming VL15 (subnet management) packets dropped"),
    (
        "port_transmit_wait_ticks",
        "ticks",
        "Ticks the port had data to send but sent none (XmitWait): the InfiniBand congestion signal",
    ),
    ("port_transmit_data_bytes", "bytes", "Data bytes transmitted (sysfs port_xmit_data x 4 octets)"),
    ("port_receive_data_bytes", "bytes", "Data bytes received (sysfs port_rcv_data x 4 octets)"),
    ("port_transmit_packets", "", "Packets transmitted"),
    ("port_receive_packets", "", "Packets received"),
    ("unicast_transmit_packets", "", "Unicast packets transmitted"),
    ("unicast_receive_packets", "", "Unicast packets received"),
    ("multicast_transmit_packets", "", "Multicast packets transmitted"),
    ("multicast_receive_packets", "", "Multicast packets received"),
    ("port_receive_discards", "", "Received packets discarded"),
    ("legacy_port_transmit_data_bytes", "bytes", "Data bytes transmitted, pre-4.5 counters_ext/"),
    ("legacy_port_receive_data_bytes", "bytes", "Data bytes received, pre-4.5 counters_ext/"),
    ("legacy_port_transmit_packets", "", "Packets transmitted, pre-4.5 counters_ext/"),
    ("legacy_port_receive_packets", "", "Packets received, pre-4.5 counters_ext/"),
    ("legacy_unicast_transmit_packets", "", "Unicast packets transmitted, pre-4.5 counters_ext/"),
    ("legacy_unicast_receive_packets", "", "Unicast packets received, pre-4.5 counters_ext/"),
    ("legacy_multicast_transmit_packets", "", "Multicast packets transmitted, pre-4.5 counters_ext/"),
    ("legacy_multicast_receive_packets", "", "Multicast packets received, pre-4.5 counters_ext/"),
)
_IB_HW = (  # hw_counters/ (mlx5: drivers/infiniband/hw/mlx5/counters.c), port or device level
    ("np_ecn_marked_roce_packets", "RoCEv2 packets received with ECN congestion experienced (CE)"),
    ("np_cnp_sent", "Congestion notification packets sent as notification point"),
    ("rp_cnp_handled", "CNPs received and acted on as reaction point"),
    ("rp_cnp_ignored", "CNPs received and ignored (should stay 0 with congestion control on)"),
    ("out_of_sequence", "Out-of-sequence packets received (loss upstream)"),
    ("packet_seq_err", "NAKs sent for packet sequence errors"),
    ("implied_nak_seq_err", "Implied NAK sequence errors (a later response arrived first)"),
    ("local_ack_timeout_err", "ACK timeouts on the requester (retransmission after a timeout)"),
    ("duplicate_request", "Duplicate requests received (the peer retransmitted)"),
    ("rnr_nak_retry_err", "Receiver-not-ready NAK retries exceeded"),
    ("req_transport_retries_exceeded", "Requests that exceeded the transport retry limit"),
    ("req_rnr_retries_exceeded", "Requests that exceeded the RNR retry limit"),
    ("roce_adp_retrans", "Adaptive retransmissions (RoCE)"),
    ("roce_adp_retrans_to", "Adaptive retransmission timeouts (RoCE)"),
    ("roce_slow_restart", "RoCE slow restarts"),
    ("roce_slow_restart_cnps", "CNPs sent during slow restart"),
    ("roce_slow_restart_trans", "Transitions to slow restart"),
    ("out_of_buffer", "Packets dropped for lack of receive WQEs"),
    ("rx_icrc_encapsulated", "RoCE packets with an invalid ICRC"),
    ("req_cqe_error", "Requester completions with error"),
    ("resp_cqe_error", "Responder completions with error"),
    ("req_cqe_flush_error", "Requester completions flushed with error"),
    ("resp_cqe_flush_error", "Responder completions flushed with error"),
    ("resp_local_length_error", "Responder local length errors"),
    ("req_remote_invalid_request", "Remote invalid request errors seen by the requester"),
    ("req_remote_access_errors", "Remote access errors seen by the requester"),
    ("resp_remote_access_errors", "Remote access errors seen by the responder"),
    ("rx_write_requests", "RDMA write requests received"),
    ("rx_read_requests", "RDMA read requests received"),
    ("rx_atomic_requests", "Atomic requests received"),
    ("rx_dct_connect", "DCT connect requests received"),
)

ETH = "fabricd_ethtool_"
_ETH_IFACE = (  # vendor-neutral names (fabricd.ethtool_names), one per NIC
    ("tx_pause_storm_warning_events", "", "Times PFC storm prevention warned (mlx5 tx_pause_storm_warning_events)"),
    ("tx_pause_storm_error_events", "", "Times PFC storm prevention stopped sending pauses: drops may follow"),
    ("rx_discards", "", "Received packets discarded by the port (mlx5 rx_discards_phy)"),
    ("tx_discards", "", "Transmit packets discarded, head-of-line drops included (mlx5 tx_discards_phy)"),
    ("rx_crc_errors", "", "Received frames with a bad FCS"),
    ("rx_symbol_errors", "", "PHY symbol errors"),
    ("link_down_events", "", "Link down events reported by the PHY (flaps)"),
    ("rx_out_of_buffer", "", "Packets dropped for lack of receive buffers"),
)
_ETH_PRIO = (  # per priority: priority="0".."7", "global" (802.3x), "all" (driver sum)
    ("rx_pause_frames", "", "PFC/pause frames received"),
    ("tx_pause_frames", "", "PFC/pause frames sent"),
    ("rx_pause_duration_seconds", "seconds", "Time the port was paused by its peer (converted from us)"),
    ("tx_pause_duration_seconds", "seconds", "Time the port paused its peer (converted from us)"),
    ("rx_pause_transitions", "", "Transitions into the paused state (receive side)"),
    ("tx_pause_transitions", "", "Transitions into the pausing state (transmit side)"),
    ("rx_buffer_discards", "", "Packets dropped for lack of receive buffer, per priority"),
    ("rx_congestion_discards", "", "Packets dropped by congestion control, per priority"),
    ("rx_ecn_marked_packets", "", "Received packets marked ECN CE, per priority"),
    ("rx_priority_bytes", "", "Bytes received per priority"),
    ("tx_priority_bytes", "", "Bytes sent per priority"),
    ("rx_priority_packets", "", "Packets received per priority"),
    ("tx_priority_packets", "", "Packets sent per priority"),
)

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

DER = "fabricd_derived_"

SELF_NODE_COLLECTOR = ("node", "collector")

CATALOGUE: tuple[MetricSpec, ...] = _rows(
    # --- infiniband collector ---
    *(_counter(IB + n, u, h, PORT) for n, u, h in _IB_PMA),
    *(_counter(IB + n, "", h, ("node", "device"), ("port",)) for n, h in _IB_HW),
    _counter(
        IB + r"[a-z_][a-z0-9_]*",
        "",
        "A hw_counters/ counter of a driver fabricd has no name for (raw name)",
        ("node", "device"),
        ("port",),
        pattern=True,
    ),
    _gauge(IB + "port_state", "", "Logical port state id (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER)", PORT),
    _gauge(IB + "port_physical_state", "", "Physical port state id (5 LinkUp, 2 Polling, 3 Disabled, ...)", PORT),
    _gauge(IB + "link_rate_bytes_per_second", "bytes/s", "Link signalling rate (sysfs rate, Gb/s x 125,000,000)", PORT),
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
    # --- ethtool collector ---
    *(_counter(ETH + n, u, h, IFACE) for n, u, h in _ETH_IFACE),
    *(_counter(ETH + n, u, h, PRIO) for n, u, h in _ETH_PRIO),
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
    # --- derived signals (computed at the agent from one scrape's rates) ---
    _gauge(DER + "ecn_marked_ratio", "ratio", "Fraction of received RoCE packets marked ECN CE", PORT),
    _gauge(DER + "cnp_sent_packets_per_second", "packets/s", "CNPs sent as notification point", PORT),
    _gauge(DER + "cnp_handled_packets_per_second", "packets/s", "CNPs handled as reaction point", PORT),
    _gauge(
        DER + "xmit_wait_lost_bytes_per_second",
        "bytes/s",
        "Bandwidth lost to credit starvation (XmitWait rate x 8 bytes per tick, an estimate)",
        PORT,
    ),
    _gauge(DER + "symbol_errors_per_gigabyte", "", "Symbol errors per 1e9 received bytes", PORT),
    _gauge(DER + "receive_errors_per_gigabyte", "", "Receive errors per 1e9 received bytes", PORT),
    _gauge(
        DER + "rx_pause_ratio", "ratio", "Fraction of the interval the priority was paused by the peer", PRIO, ("port",)
    ),
    _gauge(DER + "tx_pause_ratio", "ratio", "Fraction of the interval the port paused its peer", PRIO, ("port",)),
    _gauge(
        DER + "nccl_efficiency_ratio",
        "ratio",
        "NCCL-tests busbw at the run's largest out-of-place size "
        "divided by the performance model's prediction on this node's fabric ports (device = op)",
        ("node", "device", "size"),
    ),
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
