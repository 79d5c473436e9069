#!/usr/bin/env python3
"""Generate fabricd's Grafana dashboards (``grafana/dashboards/*.json``) from this one file.

    python grafana/generate.py            # rewrite the JSON files
    python grafana/generate.py --check    # exit 1 if the committed JSON differs (CI)

Plain Python (no grafanalib): the dashboard model is small and this keeps the JSON reviewable in a
diff. Every PromQL expression here is evaluated against a real Prometheus scraping a running fabricd
by ``tests/test_dashboards_prometheus.py``; template variables are ``$node``, ``$device``, ``$port``
(and ``$op`` on the NCCL dashboard). Metric names are in ``fabricd/catalogue.py``; those of derived
signals and counters are built here from the signal table (``fabricd/signal_table.py``: name, unit,
help) and the neutral vocabulary (``fabricd/drivers/vocabulary.py``), and the thresholds quoted in
panel descriptions are read from ``rules/detection/``, so a renamed signal or a new threshold
changes the dashboards with it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fabricd import signal_table
from fabricd.detect.rules import load_rules
from fabricd.detect.signals import SIGNALS as DETECTOR_SIGNALS
from fabricd.drivers.vocabulary import VOCABULARY
from fabricd.naming import metric_stem

OUT = Path(__file__).resolve().parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
NODE = 'node=~"$node"'
PORT = 'node=~"$node",device=~"$device",port=~"$port"'
Panel = dict[str, Any]
RULES = {r.name: r for r in load_rules(None, DETECTOR_SIGNALS).rules}


def derived(signal: str) -> str:
    """The exported family of a signal the agent derives (``fabricd_derived_<name>``)."""
    s = signal_table.BY_NAME[signal]
    assert s.agent, f"{signal} is not exported by the agent"
    return metric_stem("derived", s.name, s.unit)


def total(signal: str, matchers: str, by: str) -> str:
    """A per-second total of the table the agent does not export, summed as the detectors do: the
    rates of the same inputs (``fabricd.signal_table.rate_families``)."""
    families = "|".join(signal_table.rate_families(signal_table.BY_NAME[signal]))
    return f'sum by ({by}) ({{__name__=~"{families}",{matchers}}})'


def rate_of(source: str, neutral: str) -> str:
    """The agent-computed rate of a counter, by its neutral name."""
    term = VOCABULARY[neutral]
    return metric_stem(source, term.name, term.unit) + "_per_second"


def about(signal: str) -> str:
    return signal_table.BY_NAME[signal].help


def threshold(rule: str) -> str:
    """The incident rule's threshold as a reader says it ("above 2%")."""
    r = RULES[rule]
    ratio = signal_table.BY_NAME[r.signal].unit == "ratio"
    value = f"{r.condition.threshold * 100:g}%" if ratio else f"{r.condition.threshold:g}"
    return f"{'above' if r.condition.op.startswith('>') else 'below'} {value}"


def target(expr: str, legend: str = "", *, instant: bool = False, ref: str = "A") -> dict[str, Any]:
    t: dict[str, Any] = {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend or "__auto"}
    if instant:
        t.update(instant=True, range=False, format="table")
    return t


def _panel(kind: str, title: str, description: str, targets: list[dict[str, Any]], unit: str, w: int, h: int) -> Panel:
    refs = "ABCDEFGH"
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [{**t, "refId": refs[i]} for i, t in enumerate(targets)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "gridPos": {"w": w, "h": h},
        "options": {},
    }


def timeseries(title: str, description: str, *targets: dict[str, Any], unit: str = "short", w: int = 12) -> Panel:
    p = _panel("timeseries", title, description, list(targets), unit, w, 8)
    p["options"] = {
        "legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return p


def stat(title: str, description: str, *targets: dict[str, Any], unit: str = "short", w: int = 6) -> Panel:
    p = _panel("stat", title, description, list(targets), unit, w, 4)
    p["options"] = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background",
        "graphMode": "none",
        "textMode": "value_and_name",
    }
    p["fieldConfig"]["defaults"]["thresholds"] = {
        "mode": "absolute",
        "steps": [{"color": "green", "value": None}, {"color": "red", "value": 1}],
    }
    return p


def table(
    title: str,
    description: str,
    *targets: dict[str, Any],
    unit: str = "short",
    w: int = 12,
    matrix: tuple[str, str] | None = None,
    thresholds: tuple[float, float] | None = None,
) -> Panel:
    p = _panel("table", title, description, list(targets), unit, w, 10)
    p["options"] = {"showHeader": True, "cellHeight": "sm"}
    if matrix is not None:  # rows x columns from two labels: a pair matrix (node x peer)
        rows, cols = matrix
        p["transformations"] = [
            {
                "id": "groupingToMatrix",
                "options": {"rowField": rows, "columnField": cols, "valueField": "Value", "emptyValue": "null"},
            }
        ]
    else:
        p["transformations"] = [{"id": "organize", "options": {"excludeByName": {"Time": True}}}]
    if thresholds is not None:
        warn, bad = thresholds
        p["fieldConfig"]["defaults"]["custom"] = {"cellOptions": {"type": "color-background"}}
        p["fieldConfig"]["defaults"]["thresholds"] = {
            "mode": "absolute",
            "steps": [
                {"color": "green", "value": None},
                {"color": "orange", "value": warn},
                {"color": "red", "value": bad},
            ],
        }
    return p


def row(title: str) -> Panel:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "gridPos": {"w": 24, "h": 1}}


def variable(name: str, query: str, label: str, *, multi: bool = True) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-var"},
        "definition": query,
        "refresh": 2,
        "sort": 3,
        "multi": multi,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }


DATASOURCE_VAR = {
    "name": "datasource",
    "label": "Prometheus",
    "type": "datasource",
    "query": "prometheus",
    "current": {},
    "hide": 0,
}
# Every agent serves fabricd_agent_info{node,version} (and the central's opt-in fleet view too).
NODE_VAR = variable("node", "label_values(fabricd_agent_info, node)", "Node")
DEVICE_VAR = variable("device", 'label_values(fabricd_infiniband_port_info{node=~"$node"}, device)', "Device")
PORT_VAR = variable("port", 'label_values(fabricd_infiniband_port_info{node=~"$node",device=~"$device"}, port)', "Port")
OP_VAR = variable("op", "label_values(fabricd_nccl_busbw_bytes_per_second, op)", "Collective")


def layout(panels: list[Panel]) -> list[Panel]:
    """Left to right, top to bottom, on Grafana's 24-column grid; ids in order."""
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24 or p["type"] == "row":
            x, y, row_h = 0, y + row_h, 0
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        p["id"] = i
        x, row_h = x + w, max(row_h, h)
        if p["type"] == "row":
            x, y, row_h = 0, y + h, 0
    return panels


def dashboard(
    uid: str, title: str, description: str, variables: list[dict[str, Any]], panels: list[Panel]
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["fabricd"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "templating": {"list": [DATASOURCE_VAR, *variables]},
        "annotations": {"list": []},
        "links": [{"title": "fabricd dashboards", "type": "dashboards", "tags": ["fabricd"], "asDropdown": True}],
        "panels": layout(panels),
    }


def overview() -> dict[str, Any]:
    return dashboard(
        "fabricd-overview",
        "fabricd / Fabric overview",
        "Incidents, hottest ports, congestion (ECN, CNP, XmitWait), PFC pause and errors.",
        [NODE_VAR],
        [
            row("Incidents"),
            stat(
                "Open incidents",
                "Incidents fabricd has not resolved (open or acked), all kinds.",
                target("sum(fabricd_incidents_open)", "open"),
            ),
            stat(
                "Critical incidents",
                "Open incidents of severity critical.",
                target('sum(fabricd_incidents_open{severity="critical"})', "critical"),
            ),
            table(
                "Open incidents by kind and severity",
                "One row per kind and severity with open incidents.",
                target(
                    "sum by (kind, severity) (fabricd_incidents_open) > 0 or sum by (kind, severity) "
                    "(fabricd_incidents_open)",
                    instant=True,
                ),
                w=12,
            ),
            table(
                "Worst port per signal (fleet)",
                "The central's fleet summary: for each derived signal, the highest value in the fleet "
                "and where it is (the per-port series come from the agents).",
                target("fabricd_fleet_signal_max", instant=True),
                w=12,
            ),
            row("Hottest ports"),
            table(
                "Top 10 ports by transmit throughput",
                "InfiniBand/RoCE ports sending the most bytes/s now.",
                target(f"topk(10, {rate_of('infiniband', 'port_transmit_data')}{{{NODE}}})", instant=True),
                unit="Bps",
            ),
            table(
                "Top 10 ports by receive throughput",
                "Ports receiving the most bytes/s now.",
                target(f"topk(10, {rate_of('infiniband', 'port_receive_data')}{{{NODE}}})", instant=True),
                unit="Bps",
            ),
            row("Congestion"),
            timeseries(
                "ECN-marked fraction (top 10 ports)",
                f"{about('ecn_marked_ratio')}; {threshold('ecn_marked')} is a congested path "
                "(incident after 10 s, alert FabricdEcnCongestion after 2 minutes).",
                target(f"topk(10, {derived('ecn_marked_ratio')}{{{NODE}}})", "{{node}}/{{device}}:{{port}}"),
                unit="percentunit",
            ),
            timeseries(
                "CNP rates per node",
                "Congestion notification packets: sent as notification point "
                "(receiver saw ECN) and handled as reaction point (sender slowed down).",
                target(f"sum by (node) ({derived('cnp_sent_packets_per_second')}{{{NODE}}})", "{{node}} sent"),
                target(f"sum by (node) ({derived('cnp_handled_packets_per_second')}{{{NODE}}})", "{{node}} handled"),
                unit="pps",
            ),
            timeseries(
                "XmitWait lost bandwidth (top 10 ports)",
                f"{about('xmit_wait_lost_bytes_per_second')}; {threshold('xmit_wait')} of the link rate is "
                "congestion (alert FabricdXmitWaitCongestion).",
                target(
                    f"topk(10, {derived('xmit_wait_lost_bytes_per_second')}{{{NODE}}})",
                    "{{node}}/{{device}}:{{port}}",
                ),
                unit="Bps",
            ),
            timeseries(
                "PFC pause fraction (top 10 NIC priorities)",
                f"{about('rx_pause_ratio')}: victims of HOL blocking or of a PFC storm "
                f"({threshold('paused_victim')}: alert FabricdPauseFraction).",
                target(f"topk(10, {derived('rx_pause_ratio')}{{{NODE}}})", "{{node}}/{{device}} prio {{priority}}"),
                unit="percentunit",
            ),
            row("Errors"),
            timeseries(
                "Symbol errors per GB (top 10 ports)",
                "Physical-layer errors per received gigabyte: a failing cable or transceiver.",
                target(f"topk(10, {derived('symbol_errors_per_gigabyte')}{{{NODE}}})", "{{node}}/{{device}}:{{port}}"),
            ),
            timeseries(
                "Discards per node",
                f"{about('discards_per_second')}; {threshold('discards')}/s is real loss (alert FabricdPortDiscards).",
                target(total("discards_per_second", NODE, "node"), "{{node}}"),
                unit="pps",
            ),
        ],
    )


def port() -> dict[str, Any]:
    return dashboard(
        "fabricd-port",
        "fabricd / Port drill-down",
        "One HCA port in depth: throughput, congestion, errors, retransmissions, state; and the "
        "node's NIC PFC counters.",
        [NODE_VAR, DEVICE_VAR, PORT_VAR],
        [
            row("Traffic"),
            timeseries(
                "Throughput",
                "Data bytes per second (port_xmit_data/port_rcv_data x 4).",
                target(
                    f"{rate_of('infiniband', 'port_transmit_data')}{{{PORT}}}",
                    "tx {{node}}/{{device}}:{{port}}",
                ),
                target(
                    f"{rate_of('infiniband', 'port_receive_data')}{{{PORT}}}",
                    "rx {{node}}/{{device}}:{{port}}",
                ),
                unit="Bps",
            ),
            timeseries(
                "Packets",
                "Packets per second.",
                target(f"{rate_of('infiniband', 'port_transmit_packets')}{{{PORT}}}", "tx {{device}}:{{port}}"),
                target(f"{rate_of('infiniband', 'port_receive_packets')}{{{PORT}}}", "rx {{device}}:{{port}}"),
                unit="pps",
            ),
            row("Congestion"),
            timeseries(
                "XmitWait",
                "Ticks per second with data to send and no credits, and the bandwidth estimate derived from it.",
                target(f"{rate_of('infiniband', 'port_transmit_wait')}{{{PORT}}}", "ticks/s {{device}}"),
                target(f"{derived('xmit_wait_lost_bytes_per_second')}{{{PORT}}}", "lost B/s {{device}}"),
            ),
            timeseries(
                "ECN and CNP",
                "ECN-marked fraction of received packets and CNPs sent/handled.",
                target(f"{derived('ecn_marked_ratio')}{{{PORT}}}", "ECN fraction {{device}}"),
                target(f"{derived('cnp_sent_packets_per_second')}{{{PORT}}}", "CNP sent/s {{device}}"),
                target(f"{derived('cnp_handled_packets_per_second')}{{{PORT}}}", "CNP handled/s {{device}}"),
            ),
            row("Errors and retransmissions"),
            timeseries(
                "Link errors",
                "Symbol errors, receive errors and transmit discards per second.",
                target(f"{rate_of('infiniband', 'symbol_errors')}{{{PORT}}}", "symbol {{device}}"),
                target(f"{rate_of('infiniband', 'port_receive_errors')}{{{PORT}}}", "rcv errors {{device}}"),
                target(f"{rate_of('infiniband', 'port_transmit_discards')}{{{PORT}}}", "discards {{device}}"),
            ),
            timeseries(
                "RDMA sequence errors and retransmissions",
                f"{about('sequence_errors_per_second')}, and {about('retransmits_per_second')}: each is a "
                f"packet lost somewhere on the path (incident and alert {threshold('sequence_errors')}/s).",
                target(total("sequence_errors_per_second", PORT, "node, device, port"), "sequence errors {{device}}"),
                target(total("retransmits_per_second", PORT, "node, device, port"), "retransmits {{device}}"),
            ),
            row("State"),
            stat(
                "Port state",
                "Logical state id: 4 = ACTIVE.",
                target(f"fabricd_infiniband_port_state{{{PORT}}}", "{{device}}:{{port}}"),
                w=6,
            ),
            stat(
                "Link rate",
                "Signalling rate of the link.",
                target(f"fabricd_infiniband_link_rate_bytes_per_second{{{PORT}}}", "{{device}}:{{port}}"),
                unit="Bps",
                w=6,
            ),
            table(
                "Link downs",
                "Cumulative link_downed count (saturates at 255).",
                target(f"fabricd_infiniband_link_downed_total{{{PORT}}}", instant=True),
                w=6,
            ),
            table(
                "Saturated counters",
                "Counters stuck at all ones, and since when: their rate is unknown.",
                target(f"fabricd_saturated_since_timestamp_seconds{{{NODE}}} * 1000", instant=True),
                unit="dateTimeAsIso",
                w=6,
            ),
            row("PFC on this node's NICs (ethtool)"),
            timeseries(
                "Pause fraction per priority",
                "Fraction of time each priority was paused by the switch (rx) and pausing it (tx).",
                target(f"{derived('rx_pause_ratio')}{{{NODE}}}", "rx {{device}} prio {{priority}}"),
                target(f"{derived('tx_pause_ratio')}{{{NODE}}}", "tx {{device}} prio {{priority}}"),
                unit="percentunit",
            ),
            timeseries(
                "Pause frames per priority",
                "PFC pause frames per second.",
                target(f"{rate_of('ethtool', 'rx_pause_frames')}{{{NODE}}}", "rx {{device}} prio {{priority}}"),
                target(f"{rate_of('ethtool', 'tx_pause_frames')}{{{NODE}}}", "tx {{device}} prio {{priority}}"),
                unit="pps",
            ),
        ],
    )


def pingmesh() -> dict[str, Any]:
    loss = (
        f"avg_over_time(fabricd_pingmesh_probes_lost_per_second{{{NODE}}}[5m]) / "
        f"(avg_over_time(fabricd_pingmesh_probes_sent_per_second{{{NODE}}}[5m]) > 0)"
    )
    return dashboard(
        "fabricd-pingmesh",
        "fabricd / Pingmesh",
        "Point-to-point probes between nodes: the p99 RTT and loss pair matrices (rows: prober "
        "node, columns: peer), and their history.",
        [NODE_VAR],
        [
            table(
                "p99 RTT matrix",
                "Latest p99 round-trip time per (node, peer): a hot row is a sick sender, a "
                "hot column a sick receiver, a block a sick switch or link.",
                target(f"max by (node, peer) (fabricd_pingmesh_rtt_p99_seconds{{{NODE}}})", instant=True),
                unit="s",
                matrix=("node", "peer"),
                thresholds=(0.0005, 0.002),
            ),
            table(
                "Loss matrix (5 min)",
                "Fraction of probes lost per (node, peer) over 5 minutes.",
                target(f"max by (node, peer) ({loss})", instant=True),
                unit="percentunit",
                matrix=("node", "peer"),
                thresholds=(0.001, 0.01),
            ),
            timeseries(
                "p99 RTT per pair",
                "p99 round-trip time per interval.",
                target(f"fabricd_pingmesh_rtt_p99_seconds{{{NODE}}}", "{{node}} -> {{peer}}"),
                unit="s",
            ),
            timeseries(
                "p50 RTT per pair",
                "Median round-trip time per interval.",
                target(f"fabricd_pingmesh_rtt_p50_seconds{{{NODE}}}", "{{node}} -> {{peer}}"),
                unit="s",
            ),
            timeseries(
                "Lost probes per second",
                "Probes without a reply within the timeout.",
                target(f"fabricd_pingmesh_probes_lost_per_second{{{NODE}}}", "{{node}} -> {{peer}}"),
                unit="pps",
            ),
            timeseries(
                "Probes sent per second",
                "Probe rate per pair (a flat zero means the prober stopped).",
                target(f"fabricd_pingmesh_probes_sent_per_second{{{NODE}}}", "{{node}} -> {{peer}}"),
                unit="pps",
            ),
            timeseries(
                "Probes the node's own host dropped or held",
                "Probe replies (prober) and requests (responder) that the node's sockets dropped, their "
                "receive queue full, and requests the responder read 0.25 s or more after they came: a "
                "stalled agent, not the fabric. The prober counts its probes in flight then as "
                "host-dropped, not lost; the central does not count its peers' loss then.",
                target(f"fabricd_pingmesh_prober_socket_drops_per_second{{{NODE}}}", "{{node}} prober drops"),
                target(f"fabricd_pingmesh_responder_socket_drops_per_second{{{NODE}}}", "{{node}} responder drops"),
                target(f"fabricd_pingmesh_responder_late_answers_per_second{{{NODE}}}", "{{node}} responder late"),
                unit="pps",
            ),
        ],
    )


def nccl() -> dict[str, Any]:
    sel = 'node=~"$node",op=~"$op"'
    return dashboard(
        "fabricd-nccl",
        "fabricd / NCCL-tests performance",
        "Bus bandwidth and time per message size over time, per node, from the NCCL-tests the agents run or tail.",
        [NODE_VAR, OP_VAR],
        [
            timeseries(
                "Bus bandwidth per size (out of place)",
                "busbw of the latest run at each message size.",
                target(
                    f'fabricd_nccl_busbw_bytes_per_second{{{sel},placement="out_of_place"}}',
                    "{{node}} {{op}} {{size}} B",
                ),
                unit="Bps",
                w=24,
            ),
            timeseries(
                "Time per size (out of place)",
                "Time of one collective at each message size.",
                target(f'fabricd_nccl_time_seconds{{{sel},placement="out_of_place"}}', "{{node}} {{op}} {{size}} B"),
                unit="s",
                w=24,
            ),
            timeseries(
                "Average bus bandwidth per node",
                "NCCL-tests' '# Avg bus bandwidth' of each run.",
                target(f"fabricd_nccl_avg_busbw_bytes_per_second{{{sel}}}", "{{node}} {{op}}"),
                unit="Bps",
            ),
            table(
                "Latest busbw by size",
                "Best node's bus bandwidth at each message size, latest run.",
                target(f"max by (op, size) (fabricd_nccl_busbw_bytes_per_second{{{sel}}})", instant=True),
                unit="Bps",
            ),
            table(
                "Last run succeeded",
                "1 = the last run completed; 0 = failed (see the failure reason).",
                target(f"fabricd_nccl_run_success{{{sel}}}", instant=True),
                w=12,
            ),
            table(
                "Wrong elements",
                "#wrong per size: must be 0 (data corruption otherwise).",
                target(f"max by (node, op) (fabricd_nccl_wrong_elements{{{sel}}})", instant=True),
                w=12,
            ),
        ],
    )


def agents() -> dict[str, Any]:
    return dashboard(
        "fabricd-agents",
        "fabricd / Agent health",
        "Is the telemetry complete? Nodes reporting, agents' last acknowledged batch, collectors, "
        "the transport spool, the central's ingest and detection, hooks and the exporter.",
        [NODE_VAR],
        [
            row("Fleet (the central's bounded view)"),
            timeseries(
                "Nodes reporting and stale",
                "Nodes the central knows, by whether they sent a batch within node_stale_seconds "
                "(alert FabricdAgentsNotReporting).",
                target("fabricd_fleet_nodes", "{{state}}"),
            ),
            timeseries(
                "Nodes per collector outcome",
                "Per collector, nodes whose last run of it succeeded (ok) or failed (failing).",
                target("fabricd_fleet_collector_nodes", "{{collector}} {{state}}"),
            ),
            row("Agents (their own /metrics)"),
            table(
                "Seconds since last acknowledged batch",
                "Per node; above 120 s the agent is not reporting (alert FabricdAgentDown).",
                target(f"time() - fabricd_agent_last_successful_send_timestamp_seconds{{{NODE}}}", instant=True),
                unit="s",
                thresholds=(30, 120),
            ),
            table(
                "Agent versions", "Version each agent reported.", target(f"fabricd_agent_info{{{NODE}}}", instant=True)
            ),
            timeseries(
                "Collector success",
                "1 = the collector's last run succeeded on that node.",
                target(f"fabricd_collector_success{{{NODE}}}", "{{node}} {{collector}}"),
            ),
            timeseries(
                "Collector duration",
                "Duration of each collector's last run.",
                target(f"fabricd_collector_duration_seconds{{{NODE}}}", "{{node}} {{collector}}"),
                unit="s",
            ),
            row("Agent transport (agents' own /metrics)"),
            timeseries(
                "Spool bytes",
                "Bytes waiting on disk while the central is unreachable; growing = telemetry is delayed.",
                target(f"fabricd_agent_spool_bytes{{{NODE}}}", "{{node}}"),
                unit="bytes",
            ),
            timeseries(
                "Batches sent and dropped",
                "Batches acknowledged per second, and given up on by reason.",
                target(f"rate(fabricd_agent_batches_sent_total{{{NODE}}}[1m])", "sent {{node}}"),
                target(
                    f"sum by (node, reason) (rate(fabricd_agent_batches_dropped_total{{{NODE}}}[5m]))",
                    "dropped {{node}} {{reason}}",
                ),
            ),
            row("Central service"),
            timeseries(
                "Ingest",
                "Samples and batches stored per second.",
                target("rate(fabricd_ingest_samples_total[1m])", "samples/s"),
                target("rate(fabricd_ingest_batches_total[1m])", "batches/s"),
            ),
            timeseries(
                "Rejected batches",
                "Batches refused by reason (limits, auth, schema).",
                target("sum by (reason) (rate(fabricd_ingest_rejected_batches_total[5m])) or vector(0)", "{{reason}}"),
            ),
            timeseries(
                "Detection lag",
                "How far detection runs behind the newest samples.",
                target("fabricd_detection_lag_seconds", "lag"),
                unit="s",
            ),
            stat("Store up", "1 if the central can read its database.", target("fabricd_store_up", "store")),
            timeseries(
                "Hook notifications",
                "Incident notifications by hook and outcome.",
                target(
                    "sum by (hook, outcome) (rate(fabricd_hook_notifications_total[5m])) or vector(0)",
                    "{{hook}} {{outcome}}",
                ),
            ),
            timeseries(
                "Series refused by /metrics",
                "Series over the exporter's cardinality caps.",
                target(
                    "sum by (family, reason) (rate(fabricd_exporter_series_refused_total[5m])) or vector(0)",
                    "{{family}} {{reason}}",
                ),
            ),
        ],
    )


DASHBOARDS = {
    "fabric-overview": overview,
    "port-drilldown": port,
    "pingmesh": pingmesh,
    "nccl-tests": nccl,
    "agent-health": agents,
}


def render(name: str) -> str:
    return json.dumps(DASHBOARDS[name](), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if the committed JSON is out of date")
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    args = parser.parse_args(argv)
    stale = []
    for name in DASHBOARDS:
        path = args.out / f"{name}.json"
        text = render(name)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)} (run python grafana/generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
