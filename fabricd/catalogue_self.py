"""Catalogue rows of fabricd's own health: the central service, its alert hooks, the agent's transport.

Split from ``fabricd.catalogue`` (which gathers every row into ``CATALOGUE``) to keep each module
small; the rows are checked against what the processes really emit by tests/test_catalogue.py.
"""

from __future__ import annotations

from fabricd.catalogue_spec import MetricSpec, gauge, rows

AGENT = ("node",)  # on the agent's own /metrics, every series of its own carries its node
SIG = ("signal", "node", "device", "port")


def _agent(name: str, mtype: str, unit: str, help: str, labels: tuple[str, ...] = ()) -> tuple[MetricSpec]:
    """One of the agent's own series: its /metrics adds ``node`` (a registry alone has none)."""
    return (MetricSpec(name, mtype, unit, help, labels, AGENT),)


SELF_ROWS: tuple[MetricSpec, ...] = rows(
    # --- central service (fabricd/server/metrics.py) ---
    gauge("fabricd_store_up", "", "1 if the fleet view could be read from the database", ()),
    gauge(
        "fabricd_agent_last_seen_timestamp_seconds",
        "seconds",
        "When the central last accepted a batch from the node's agent",
        ("node",),
    ),
    gauge("fabricd_agent_info", "", "Agent version per node (value 1)", ("node", "version")),
    gauge("fabricd_collector_success", "", "1 if the collector's last run succeeded", ("collector",), ("node",)),
    gauge(
        "fabricd_collector_duration_seconds",
        "seconds",
        "Duration of the collector's last run",
        ("collector",),
        ("node",),
    ),
    gauge("fabricd_incidents_open", "", "Incidents not yet resolved (open or acknowledged)", ("kind", "severity")),
    # --- central service, bounded fleet summaries (fabricd/server/fleet_summary.py) ---
    gauge("fabricd_fleet_signal_series", "", "Series reporting the derived signal across the fleet", ("signal",)),
    gauge("fabricd_fleet_signal_mean", "", "Mean of the derived signal over the fleet's series", ("signal",)),
    gauge("fabricd_fleet_signal_max", "", "Highest value of the derived signal in the fleet, with where it is", SIG),
    gauge("fabricd_fleet_nodes", "", "Nodes known to the central, by whether they sent a batch lately", ("state",)),
    gauge("fabricd_fleet_agent_version_nodes", "", "Nodes by the agent version they last reported", ("version",)),
    gauge("fabricd_fleet_collector_nodes", "", "Nodes by their collector's last outcome", ("collector", "state")),
    (
        MetricSpec("fabricd_ingest_batches_total", "counter", "", "Batches accepted and stored", ()),
        MetricSpec("fabricd_ingest_samples_total", "counter", "", "Samples accepted and stored", ()),
        MetricSpec("fabricd_ingest_rejected_batches_total", "counter", "", "Batches refused, by reason", ("reason",)),
        MetricSpec("fabricd_ingest_duplicate_batches_total", "counter", "", "Retried batches acknowledged again", ()),
        MetricSpec("fabricd_ingest_series_created_total", "counter", "", "New series stored", ()),
        MetricSpec(
            "fabricd_ingest_forwarded_batches_total", "counter", "", "Batches published to the bus for their owner", ()
        ),
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
    gauge(
        "fabricd_store_latest_unflushed_series",
        "",
        "Series whose latest value is in memory only (written every latest_flush_seconds)",
        (),
    ),
    gauge(
        "fabricd_detection_lag_seconds",
        "seconds",
        "Wall time minus the event time of the newest sample the detectors processed",
        (),
    ),
    gauge("fabricd_detection_backlog_points", "", "Stored points the detectors have not processed yet", ()),
    gauge(
        "fabricd_topology_changes", "", "Differences between the agents' LLDP topology and the stored one", ("kind",)
    ),
    gauge(
        "fabricd_detection_settled_timestamp_seconds",
        "seconds",
        "Event time up to which every live node has delivered and detection has evaluated",
        (),
    ),
    gauge("fabricd_detection_settlement_lag_seconds", "seconds", "Wall time minus the settled event time", ()),
    gauge(
        "fabricd_detection_max_node_lateness_seconds",
        "seconds",
        "Wall time minus the oldest watermark of a node still waited for",
        (),
    ),
    gauge("fabricd_detection_nodes_left_out", "", "Nodes silent past the allowed lateness, left out of settlement", ()),
    gauge(
        "fabricd_detection_node_left_out",
        "",
        "1 while this node is left out of settlement (silent past the allowed lateness)",
        ("node",),
    ),
    (
        MetricSpec(
            "fabricd_detection_late_samples_total",
            "counter",
            "",
            "Detection inputs that arrived after their moment was settled (folded into the next evaluation)",
            (),
        ),
    ),
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
    gauge("fabricd_hook_queue_depth", "", "Notifications waiting per hook", ("hook",)),
    # --- agent transport (fabricd/transport/metrics.py; the agent's own /metrics adds ``node``) ---
    _agent("fabricd_agent_batches_sent_total", "counter", "", "Batches acknowledged by the central service"),
    _agent("fabricd_agent_batches_retried_total", "counter", "", "Sends of batches that failed once or were spooled"),
    _agent("fabricd_agent_batches_spooled_total", "counter", "", "Batches written to the on-disk spool"),
    _agent("fabricd_agent_batches_dropped_total", "counter", "", "Batches given up on, by reason", ("reason",)),
    _agent("fabricd_agent_spool_quarantined_total", "counter", "", "Spool files quarantined (corrupt or rejected)"),
    _agent("fabricd_agent_send_duration_seconds", "histogram", "seconds", "Duration of one send attempt"),
    _agent("fabricd_agent_spool_bytes", "gauge", "bytes", "Bytes held in the agent's spool"),
    _agent("fabricd_agent_spool_batches", "gauge", "", "Batches held in the agent's spool"),
    _agent("fabricd_agent_central_up", "gauge", "", "1 while the last send to the central service succeeded"),
    _agent("fabricd_agent_last_successful_send_timestamp_seconds", "gauge", "seconds", "When the central last acked"),
)
