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

from dataclasses import replace
from functools import cache

from fabricd import signal_table as table
from fabricd.catalogue_self import SELF_ROWS
from fabricd.catalogue_spec import MetricSpec, counter, gauge, rows
from fabricd.derived import MODEL_INFO, MODEL_INFO_HELP, MODEL_INFO_LABELS
from fabricd.drivers import ethtool as eth
from fabricd.drivers import ib
from fabricd.drivers.ib import pma
from fabricd.drivers.vocabulary import PORT as PORT_ATTRIBUTES
from fabricd.drivers.vocabulary import VOCABULARY, Term
from fabricd.jobs_catalogue import JOB_FAMILIES
from fabricd.model import Kind
from fabricd.naming import metric_stem

IB_SOURCE = "infiniband"
MEASURED = frozenset({"bytes", "seconds", "ticks", "ratio"})  # units a name carries (fabricd.naming)


PORT = ("node", "device", "port")
AGENT = ("node",)  # on the agent's own /metrics, every series of its own carries its node
SIG = ("signal", "node", "device", "port")
IFACE = ("node", "device")
LLDP_NEIGHBOR = ("chassis", "chassis_id", "port_id", "port_id_type", "port_descr", "port", "mgmt_ip", "capabilities")
LLDP_CHASSIS = ("chassis", "chassis_id", "capabilities")
IB_CABLE = ("guid", "type", "desc", "width", "speed", "remote_guid", "remote_type", "remote_port", "remote_desc")
PATH_TRACE = ("src", "src_port", "dst", "dst_port", "hops", "reached", "reason")
IB_PATH = ("src_node", "src", "dst", "hops", "reached", "reason")
PRIO = ("node", "device", "priority")
QDISC = ("node", "device", "qdisc", "handle", "parent")


def _unit(term: Term) -> str:
    """The catalogue's unit: base units of measurement; counts of things have none."""
    return {"bytes_per_second": "bytes/s"}.get(term.unit, term.unit if term.unit in MEASURED else "")


def _term(source: str, term: Term, labels: tuple[str, ...], optional: tuple[str, ...] = ()) -> tuple[MetricSpec, ...]:
    """The families of one neutral name as ``source`` exposes it (``fabricd.naming``)."""
    stem = metric_stem(source, term.name, term.unit)
    if term.kind is Kind.GAUGE:
        return gauge(stem, _unit(term), term.meaning, labels, optional)
    return counter(stem, _unit(term), term.meaning, labels, optional)


def _ib_rows() -> tuple[MetricSpec, ...]:
    """counters/ rows per port; hw_counters/ rows of every driver table, per device or port."""
    pma_terms = dict.fromkeys(c.name for c in (*pma.COUNTERS.values(), *pma.EXT.values()))
    hw_terms = dict.fromkeys(c.name for d in ib.drivers() for c in d.counters)
    return rows(
        *(_term(IB_SOURCE, VOCABULARY[n], PORT) for n in pma_terms),
        *(_term(IB_SOURCE, VOCABULARY[n], ("node", "device"), ("port",)) for n in hw_terms),
        *(_term(IB_SOURCE, t, PORT) for t in PORT_ATTRIBUTES),
    )


def _ethtool_rows() -> tuple[MetricSpec, ...]:
    """One family per neutral name the ethtool tables use; per priority when any rule gives one."""
    per_priority: dict[str, bool] = {}
    for rule in (r for d in eth.drivers() for r in d.rules):
        per_priority[rule.name] = per_priority.get(rule.name, False) or rule.priority is not None
    return rows(*(_term("ethtool", VOCABULARY[n], PRIO if p else IFACE) for n, p in per_priority.items()))


def _derived_rows() -> tuple[MetricSpec, ...]:
    signals = (s for s in table.SIGNALS if s.agent)
    return rows(
        *(
            gauge(metric_stem("derived", s.name, s.unit), _RATES.get(s.unit, ""), s.help, s.labels, s.optional_labels)
            for s in signals
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
    (
        "probes_host_dropped",
        "Unanswered probes this host may have dropped itself (unsent, or its socket dropped replies)",
    ),
)

NC = "fabricd_nccl_"
NCCL_ROW = ("node", "op", "size", "placement")
NCCL_RUN = ("node", "op")


SELF_NODE_COLLECTOR = ("node", "collector")

CATALOGUE: tuple[MetricSpec, ...] = rows(
    # --- infiniband collector (tables: fabricd/drivers/ib/) ---
    _ib_rows(),
    counter(
        IB + r"[a-z_][a-z0-9_]*",
        "",
        "A hw_counters/ counter of a driver fabricd has no name for (raw name)",
        ("node", "device"),
        ("port",),
        pattern=True,
    ),
    gauge(
        IB + "device_info",
        "",
        "HCA attributes (value 1)",
        ("node", "device"),
        ("firmware_version", "board_id", "hca_type", "node_guid"),
    ),
    gauge(
        IB + "port_info",
        "",
        "Port link layer, state names and netdev (value 1)",
        PORT,
        ("link_layer", "state", "phys_state", "netdev"),
    ),
    # --- lldp collector (docs/topology.md) ---
    gauge("fabricd_lldp_neighbor_info", "", "A neighbour lldpd heard on an interface (value 1)", IFACE, LLDP_NEIGHBOR),
    gauge("fabricd_lldp_chassis_info", "", "This machine's LLDP chassis (value 1)", ("node",), LLDP_CHASSIS),
    # --- ibfabric collector: what ibnetdiscover found (docs/topology.md "InfiniBand") ---
    gauge(
        "fabricd_ibfabric_cable_info",
        "",
        "A cabled port as ibnetdiscover saw it, with its far end (value 1)",
        PORT,
        IB_CABLE,
    ),
    gauge(
        "fabricd_ibfabric_path_info",
        "",
        "The last ibtracert path between two hosts' HCA ports: switch GUIDs, then the destination's (value 1)",
        ("node", "device"),
        IB_PATH,
    ),
    # --- ethtool collector (tables: fabricd/drivers/ethtool/) ---
    _ethtool_rows(),
    counter(
        ETH + r"[a-z_][a-z0-9_]*",
        "",
        "An ethtool -S statistic without a neutral name (raw name; only with include_unmapped or include_queues)",
        IFACE,
        pattern=True,
    ),
    gauge(ETH + "link_speed_bytes_per_second", "bytes/s", "Negotiated link speed", IFACE),
    gauge(ETH + "link_detected", "", "1 if the link is detected (ethtool link status)", IFACE),
    gauge(
        ETH + "driver_info",
        "",
        "NIC driver attributes (value 1)",
        IFACE,
        ("driver", "version", "firmware_version", "bus_info"),
    ),
    # --- netlink collector ---
    *(counter(NL + n, u, h, IFACE) for n, u, h in _NL_LINK),
    *(counter(NL + n, u, h, QDISC) for n, u, h in _NL_QDISC),
    gauge(NL + "qdisc_backlog_bytes", "bytes", "Bytes queued in the qdisc now", QDISC),
    gauge(NL + "qdisc_backlog_packets", "", "Packets queued in the qdisc now", QDISC),
    # --- pingmesh collector (peer = the probed node) ---
    *(counter(PM + n, "", h, ("node", "peer")) for n, h in _PM_COUNTERS),
    *(
        gauge(PM + f"rtt_{q}_seconds", "seconds", f"Round-trip time {q} over the last interval", ("node", "peer"))
        for q in ("min", "p50", "p90", "p99", "max")
    ),
    *(
        counter(
            PM + f"{end}_socket_drops", "", f"Datagrams the {end}'s socket dropped (its receive queue full)", ("node",)
        )
        for end in ("prober", "responder")
    ),
    counter(
        PM + "responder_late_answers",
        "",
        "Probe requests this node's responder read 0.25 s or more after they arrived (its agent stalled)",
        ("node",),
    ),
    gauge(
        PM + "responder_start_time_seconds",
        "seconds",
        "When this node's probe responder began answering (Unix time): its peers' probes before it were unanswerable",
        ("node",),
    ),
    gauge(
        PM + "path_info",
        "",
        "The last traced path of the probes to a peer: hop addresses in TTL order (value 1)",
        ("node", "peer"),
        PATH_TRACE,
    ),
    # --- nccl collector (op = the collective, e.g. all_reduce) ---
    gauge(
        NC + "time_seconds",
        "seconds",
        "Time of one collective at this size (NCCL-tests time column)",
        NCCL_ROW,
        ("root",),
    ),
    gauge(NC + "algbw_bytes_per_second", "bytes/s", "Algorithm bandwidth at this size", NCCL_ROW, ("root",)),
    gauge(
        NC + "busbw_bytes_per_second",
        "bytes/s",
        "Bus bandwidth at this size (comparable across ops)",
        NCCL_ROW,
        ("root",),
    ),
    gauge(NC + "wrong_elements", "", "Wrong elements reported (#wrong; must be 0)", NCCL_ROW, ("root",)),
    gauge(NC + "avg_busbw_bytes_per_second", "bytes/s", "Average bus bandwidth of the last run", NCCL_RUN),
    gauge(NC + "out_of_bounds_values", "", "Out-of-bounds values of the last run", NCCL_RUN),
    gauge(NC + "run_success", "", "1 if the last run completed without error", NCCL_RUN),
    gauge(
        NC + "run_host_info",
        "",
        "1 per host of the last run (from its '#  Rank N ... on HOST' lines): who ran with whom",
        (*NCCL_RUN, "host"),
    ),
    gauge(NC + "run_duration_seconds", "seconds", "Wall time of the last run", NCCL_RUN),
    gauge(
        NC + "run_failed_last_timestamp_seconds", "seconds", "When a run last failed, by reason", NCCL_RUN, ("reason",)
    ),
    counter(NC + "runs_skipped", "", "Runs not started because the previous one was still running", NCCL_RUN),
    gauge(NC + "nodes", "", "Nodes of the last run's job (distinct hosts of its ranks, or the nodes option)", NCCL_RUN),
    gauge(NC + "ranks", "", "Ranks (GPUs) of the last run's job", NCCL_RUN),
    gauge(
        NC + "model_efficiency_ratio",
        "ratio",
        "Achievable fraction of line rate the performance model "
        "assumes for this job (option model_efficiency, else the model default), by algorithm",
        (*NCCL_RUN, "algo"),
    ),
    # --- jobs collector (docs/jobs.md): info series to join on, never a label on every sample ---
    *(gauge(name, "", help, labels, optional) for name, help, labels, optional in JOB_FAMILIES),
    # --- derived signals (computed at the agent from one scrape's rates: fabricd/signal_table.py) ---
    _derived_rows(),
    gauge(f"fabricd_derived_{MODEL_INFO}_info", "", MODEL_INFO_HELP, ("node", "device", *MODEL_INFO_LABELS)),
    # --- counter semantics ---
    gauge(
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
            "Series left out of /metrics, by family and reason (family_cap, fleet_cap, label_too_long, type_conflict)",
            ("family", "reason"),
        ),
    ),
    SELF_ROWS,
)
# A run read from a log file also carries the file's name (collectors/nccl.py with_file).
CATALOGUE = tuple(replace(s, optional=(*s.optional, "file")) if s.name.startswith(NC) else s for s in CATALOGUE)


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
