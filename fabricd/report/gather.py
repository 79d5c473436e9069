"""Gather a report's data from a ``Source`` (REST or in-process): incidents, series, pingmesh, NCCL.

Everything is read through the REST API's resources, so a report shows exactly what
``GET /api/v1/series`` and friends return for the same window. Windows up to ``RAW_MAX_SECONDS``
are read raw; longer ones in buckets (the series route's ``step``) so a plot stays around
``TARGET_POINTS`` points and the store's per-series point limit is never hit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from fabricd import signal_table as table
from fabricd.model import Kind, Labels, Reading, Sample, Status
from fabricd.portview import LINK_RATE, PAUSE, RX_BYTES, TX_BYTES, XMIT_WAIT, port_views, select_ports
from fabricd.progress import Step, quiet
from fabricd.report.data import (
    HotPort,
    PingCell,
    PortPanel,
    ReportData,
    ReportQuery,
    Series,
    Shade,
    Window,
)
from fabricd.report.nccl import nccl_curves
from fabricd.report.source import Source
from fabricd.signal_math import loss_ratio, scopes

RAW_MAX_SECONDS = 3600.0
TARGET_POINTS = 600
HOT_BUCKETS = 8  # the hottest-ports table averages a few buckets per series over the window
SERIES_LIMIT = 1000  # the series route's maximum; reaching it means the answer was cut
# Throughput counters, IB first: (receive, transmit) by fabricd name (fabricd/portview.py).
THROUGHPUT = (("port_receive_data", "port_transmit_data"), ("rx_bytes", "tx_bytes"))
PING_P99, PING_SENT, PING_LOST, PING_LATE = "rtt_p99_seconds", "probes_sent", "probes_lost", "probes_late"
MAX_SIGNAL_SERIES = 4  # per port: the plot stays readable
STEPS = 6  # progress: incidents, ports, pingmesh, nccl, hottest ports, then the drawing (build_report)


def gather(src: Source, query: ReportQuery, now: float, step: Step = quiet) -> ReportData:
    if query.incident_id is not None:
        data = _for_incident(src, query, query.incident_id, now)
    else:
        data = _for_range(src, query, now)
    step(note="incidents")
    data.ports = implicated_ports(src, data, query.max_ports)
    step(note="ports")
    data.pingmesh = pingmesh(src, data)
    step(note="pingmesh")
    data.nccl = nccl_curves(src, data)
    step(note="nccl")
    data.hot_ports = hot_ports(src, data)
    step(note="hottest ports")
    return data


# --- incidents and the window -------------------------------------------------------------------


def incident_end(inc: dict[str, Any], now: float) -> float:
    """Resolved: when it was resolved. Open: the latest thing known of it (update, evidence, timeline)."""
    if inc.get("resolved_ts") is not None:
        end = float(inc["resolved_ts"])
    else:
        seen = [
            inc["updated_ts"],
            *(e["ts"] for e in inc.get("evidence", [])),
            *(t["ts"] for t in inc.get("timeline", [])),
        ]
        end = float(max(seen))
    return min(max(end, inc["started_ts"]), now)


def _shade(inc: dict[str, Any], window_end: float, now: float) -> Shade:
    """Open incidents are shaded to the end of the window: they are still going on."""
    end = incident_end(inc, now) if inc.get("resolved_ts") is not None else window_end
    state = "" if inc.get("resolved_ts") is not None else ", open"
    return Shade(inc["started_ts"], max(end, inc["started_ts"]), f"#{inc['id']} {inc['kind']}{state}")


def _for_incident(src: Source, query: ReportQuery, incident_id: int, now: float) -> ReportData:
    inc = src.get("incident", id=incident_id)
    pad = query.pad_seconds
    window = Window(inc["started_ts"] - pad, min(now, incident_end(inc, now) + pad))
    title = f"Incident #{inc['id']}: {inc['kind']} at {inc['element']}"
    return ReportData(title, window, now, query, incidents=[inc], shades=[_shade(inc, window.end, now)])


def _for_range(src: Source, query: ReportQuery, now: float) -> ReportData:
    assert query.since is not None
    window = Window(query.since, query.until if query.until is not None else now)
    rows = src.get("incidents", since=_t(window.start), limit=query.max_incidents + 1)
    rows = [r for r in rows if r["started_ts"] <= window.end]
    data = ReportData("Fabric report", window, now, query)
    if len(rows) > query.max_incidents:
        data.notes.append(f"only the {query.max_incidents} newest incidents of the window are shown")
    data.incidents = [src.get("incident", id=r["id"]) for r in rows[: query.max_incidents]]
    data.shades = [_shade(inc, window.end, now) for inc in data.incidents]
    return data


def _t(ts: float) -> str:
    return repr(float(ts))  # epoch seconds: exact, and accepted by every time parameter


def series_step(window: Window) -> str | None:
    if window.seconds <= RAW_MAX_SECONDS:
        return None
    return f"{math.ceil(window.seconds / TARGET_POINTS)}s"


# --- series ---------------------------------------------------------------------------------------


def to_series(row: dict[str, Any]) -> Series:
    """``GET /api/v1/series`` JSON -> the plotted values: rates of counters, values of gauges."""
    counter = row["kind"] == Kind.COUNTER.value
    pts = row["points"]
    return Series(
        node=row["node"],
        device=row["device"],
        port=row["port"],
        name=row["name"],
        unit=row["unit"],
        kind=row["kind"],
        step_seconds=row["step_seconds"],
        ts=[p["ts"] for p in pts],
        values=[p["rate"] if counter else p["value"] for p in pts],
    )


def fetch_series(src: Source, window: Window, **match: Any) -> list[dict[str, Any]]:
    """The matching series that have points in the window (a series known but silent is left out)."""
    rows: list[dict[str, Any]] = src.get(
        "series", since=_t(window.start), until=_t(window.end), step=series_step(window), limit=SERIES_LIMIT, **match
    )
    return [r for r in rows if r["points"]]


def _port_keys(incidents: Iterable[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    """Ports named by the evidence, then HCA ports named by localization candidates (``node/dev``)."""
    keys: list[tuple[str, str, str | None]] = []
    for inc in incidents:
        keys += [(e["node"], e["device"], e["port"]) for e in inc.get("evidence", []) if e["node"] and e["device"]]
        for c in inc.get("candidates", []):
            head = c["element"].split("~", 1)[0]
            if head.count("/") == 1:
                node, device = head.split("/")
                keys.append((node, device, None))
    return list(dict.fromkeys(keys))


def _signals_at(incidents: Iterable[dict[str, Any]], node: str, device: str) -> list[str]:
    names = [
        e["signal"] for inc in incidents for e in inc.get("evidence", []) if e["node"] == node and e["device"] == device
    ]
    return list(dict.fromkeys(names))


def implicated_ports(src: Source, data: ReportData, limit: int) -> list[PortPanel]:
    """Throughput and evidence-signal series of each implicated port that has stored port series.

    Pair signals name a peer node as the device (pingmesh); those have no port series and are
    shown in the pingmesh section instead."""
    panels: list[PortPanel] = []
    for node, device, port in _port_keys(data.incidents):
        if len(panels) >= limit:
            data.notes.append(f"only the first {limit} implicated ports are plotted")
            break
        panel = _port_panel(src, data, node, device, port)
        if panel is not None and not any(p.label == panel.label for p in panels):
            panels.append(panel)
    return panels


def _port_panel(src: Source, data: ReportData, node: str, device: str, port: str | None) -> PortPanel | None:
    for names in THROUGHPUT:
        rows = [
            r for n in names for r in fetch_series(src, data.window, node=node, device=device, port=port, counter=n)
        ]
        if rows:
            break
    else:
        return None
    panel = PortPanel(node, device, rows[0]["port"] if port is None else port, [to_series(r) for r in rows])
    for signal in _signals_at(data.incidents, node, device):
        found = _signal_series(src, data.window, panel, signal)
        panel.signals += found[: MAX_SIGNAL_SERIES - len(panel.signals)]
        if not found:
            panel.missing.append(signal)
    return panel


def _signal_series(src: Source, window: Window, panel: PortPanel, signal: str) -> list[Series]:
    """The signal's stored series (the agent's derived signals are stored), else the signal computed
    from its stored inputs by its one function (``fabricd.signal_table``), as the detectors did."""
    where = {"node": panel.node, "device": panel.device, "port": panel.port}
    found = fetch_series(src, window, counter=signal, **where)
    if found:
        return [to_series(r) for r in found]
    spec = table.BY_NAME.get(signal)
    return computed_series(src, window, panel, spec) if spec is not None and spec.compute else []


def computed_series(src: Source, window: Window, panel: PortPanel, spec: table.Signal) -> list[Series]:
    """``spec`` at each stored point of its inputs on the panel's port, per source and labels: the
    inputs of one scrape (or bucket) are split into the table's scopes and the signal evaluated."""
    names = sorted({n for slot in spec.inputs for n in slot})
    rows = [r for n in names for r in fetch_series(src, window, node=panel.node, device=panel.device, counter=n)]
    points: dict[tuple[str, float], dict[tuple[str, str, Labels], float | None]] = {}
    for row in rows:
        key = (row["name"], row["port"], tuple(sorted(row["labels"].items())))
        value = "rate" if row["kind"] == Kind.COUNTER.value else "value"
        for p in row["points"]:
            points.setdefault((row["source"], p["ts"]), {})[key] = p[value]
    out: dict[tuple[str, Labels], Series] = {}
    step = rows[0]["step_seconds"] if rows else None
    for (source, ts), values in sorted(points.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        for (port, labels), scope in scopes(values).items():
            if port != panel.port:
                continue
            for _, v in table.evaluate(scope, (spec,)):
                series = out.setdefault((source, labels), _empty(panel, spec, step))
                series.ts.append(ts)
                series.values.append(v)
    return list(out.values())


def _empty(panel: PortPanel, spec: table.Signal, step: float | None) -> Series:
    return Series(panel.node, panel.device, panel.port, spec.name, spec.unit, Kind.GAUGE.value, step)


# --- pingmesh ---------------------------------------------------------------------------------------


def pingmesh(src: Source, data: ReportData) -> list[PingCell]:
    """Per probed pair over the window: the worst p99 RTT and the share of probes never answered
    (``fabricd.signal_math.loss_ratio``: lost less late).

    Every point is one collect interval, so summing the per-second rates of probes_lost, probes_late
    and probes_sent weighs every interval alike: their ratio is the window's loss ratio."""
    by_name: dict[str, dict[tuple[str, str], list[float]]] = {}
    for name in (PING_P99, PING_SENT, PING_LOST, PING_LATE):
        rows = fetch_series(src, data.window, source="pingmesh", counter=name)
        if len(rows) >= SERIES_LIMIT:
            data.notes.append(f"pingmesh: only the first {SERIES_LIMIT} pairs of {name} were read")
        cells = by_name.setdefault(name, {})
        for row in rows:
            s = to_series(row)
            if values := [v for v in s.values if v is not None]:
                cells.setdefault((s.node, s.device), []).extend(values)
    pairs = sorted(set().union(*(set(c) for c in by_name.values())))
    return [_cell(src_, dst, by_name) for src_, dst in pairs]


def _cell(src: str, dst: str, by_name: dict[str, dict[tuple[str, str], list[float]]]) -> PingCell:
    p99 = by_name[PING_P99].get((src, dst), [])
    sent, lost, late = (sum(by_name[name].get((src, dst), [])) for name in (PING_SENT, PING_LOST, PING_LATE))
    return PingCell(src, dst, max(p99) if p99 else None, loss_ratio((sent, lost, late)))


# --- hottest ports ---------------------------------------------------------------------------------


def hot_ports(src: Source, data: ReportData) -> list[HotPort]:
    """The ports with the highest mean throughput over the window (``fabricd/portview.py`` maths)."""
    bucket = f"{max(1, math.ceil(data.window.seconds / HOT_BUCKETS))}s"
    latest: list[tuple[str, Sample]] = []
    for name in sorted(RX_BYTES | TX_BYTES | PAUSE | XMIT_WAIT | LINK_RATE):
        rows = src.get(
            "series",
            counter=name,
            since=_t(data.window.start),
            until=_t(data.window.end),
            step=bucket,
            limit=SERIES_LIMIT,
        )
        if len(rows) >= SERIES_LIMIT:
            data.notes.append(f"hottest ports: only the first {SERIES_LIMIT} series of {name} were read")
        latest += [m for row in rows if (m := _window_mean(row)) is not None]
    views = select_ports(port_views(latest), None, "throughput", data.query.top)
    return [HotPort(v.node, v.device, v.port, v.rx, v.tx, v.link, v.utilization, v.pause, v.xmit_wait) for v in views]


def _window_mean(row: dict[str, Any]) -> tuple[str, Sample] | None:
    """One series' buckets -> a sample whose rate (counters) or value (gauges) is the window mean."""
    pts = row["points"]
    rates = [p["rate"] for p in pts if p["rate"] is not None]
    if not pts:
        return None
    value = sum(p["value"] for p in pts) / len(pts)
    reading = Reading(
        row["source"],
        row["device"],
        row["port"],
        row["counter"],
        value,
        row["unit"],
        Kind(row["kind"]),
        tuple(sorted(row["labels"].items())),
        row["name"],
    )
    rate = sum(rates) / len(rates) if rates else None
    return row["node"], Sample(pts[-1]["ts"], reading, rate, Status.OK if rate is not None else Status.FIRST)
