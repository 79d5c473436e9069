"""Render ``ReportData`` to one self-contained HTML page (PNG plots inlined as base64) and the PNGs.

Pure: data in, ``Report`` out; writing files is ``write_report``. Every value from the fleet is
HTML-escaped (node names, summaries and notes come from agents and engineers). A section without
data says so in words rather than showing an empty plot.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from fabricd import incident_view as view
from fabricd import units
from fabricd.next_checks import next_checks
from fabricd.report.data import HotPort, ReportData
from fabricd.report.plots import Plot, nccl_plot, pingmesh_plot, port_plot
from fabricd.timeparse import iso

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0 1em}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;
font-size:.9em}th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;border:1px solid #eee}p.empty{color:#777;font-style:italic}.sev-critical{color:#b00}
.sev-warning{color:#b60}p.note{color:#555;font-size:.9em}
"""


@dataclass
class Report:
    html: str
    plots: list[Plot] = field(default_factory=list)

    def plot(self, name: str) -> Plot:
        for p in self.plots:
            if p.name == name:
                return p
        raise KeyError(f"no plot {name!r}; plots: {', '.join(p.name for p in self.plots)}")


def render(data: ReportData) -> Report:
    plots: list[Plot] = []
    w = data.window
    body = [
        f"<h1>{escape(data.title)}</h1>",
        _p(f"Window {iso(w.start)} – {iso(w.end)} (UTC); generated {iso(data.generated_ts)} by fabricd."),
        *_incidents(data),
        *_ports(data, plots),
        *_pingmesh(data, plots),
        *_nccl(data, plots),
        *_hot_ports(data),
        *[f'<p class="note">Note: {escape(n)}</p>' for n in dict.fromkeys(data.notes)],
    ]
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(data.title)}</title><style>{CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
    return Report(page, plots)


def write_report(report: Report, out_dir: Path, png_only: bool = False) -> list[Path]:
    """Write ``report.html`` (unless ``png_only``) and one PNG per plot into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for p in report.plots:
        path = out_dir / f"{p.name}.png"
        path.write_bytes(p.png)
        written.append(path)
    if not png_only:
        path = out_dir / "report.html"
        path.write_text(report.html, encoding="utf-8")
        written.insert(0, path)
    return written


# --- sections ---------------------------------------------------------------------------------------


def _p(text: str) -> str:
    return f"<p>{escape(text)}</p>"


def _empty(text: str) -> str:
    return f'<p class="empty">{escape(text)}</p>'


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{escape(str(v))}</td>' if i in numeric else f"<td>{escape(str(v))}</td>"
            for i, v in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(plot: Plot) -> str:
    b64 = base64.b64encode(plot.png).decode("ascii")
    return f'<p><img alt="{escape(plot.title)}" src="data:image/png;base64,{b64}"></p>'


def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _incidents(data: ReportData) -> list[str]:
    out = ["<h2>Incidents</h2>"]
    if not data.incidents:
        return [*out, _empty("No incident was open in this window.")]
    for inc in data.incidents:
        out += _incident(inc)
    return out


def _incident(inc: dict[str, Any]) -> list[str]:
    sev = escape(inc["severity"])
    out = [
        f"<h3>#{inc['id']} {escape(inc['kind'])} at {escape(inc['element'])} "
        f'<span class="sev-{sev}">{sev}</span> ({escape(inc["state"])})</h3>',
        _p(inc["summary"]),
        _table(
            ["id", "kind", "severity", "state", "element", "started", "updated", "resolved", "acked by"],
            [
                [
                    inc["id"],
                    inc["kind"],
                    inc["severity"],
                    inc["state"],
                    inc["element"],
                    iso(inc["started_ts"]),
                    iso(inc["updated_ts"]),
                    iso(inc.get("resolved_ts")),
                    inc.get("acked_by") or "-",
                ]
            ],
        ),
    ]
    hit = view.affected(inc)
    out += [f"<h4>Affected: {escape(hit.counts())}</h4>"]
    out += [_p(f"{label}: {', '.join(items)}") for label, items in _affected_lists(hit) if items]
    if "affected_jobs" in inc:  # the API names jobs (a central with the jobs join)
        jobs = [[j["id"], j["user"], j["name"], " ".join(j["nodes"])] for j in inc["affected_jobs"]]
        out += [
            "<h4>Affected jobs</h4>",
            _table(["job", "user", "name", "nodes hit"], jobs, []) if jobs else _empty("No job runs across it."),
        ]
    cands = view.candidate_rows(inc)
    out += [
        "<h4>Localization candidates (by score, best first; equal scores are ties)</h4>",
        _table(view.CANDIDATE_COLUMNS, cands, [2, 3]) if cands else _empty("No localization candidates."),
        *(_p(note) for note in view.tie_notes(inc)),
    ]
    ev = view.evidence_rows(inc)
    out += [
        "<h4>Evidence (furthest past its threshold first)</h4>",
        _table(view.EVIDENCE_COLUMNS, ev, [2, 3]) if ev else _empty("No evidence recorded."),
    ]
    tl = [[iso(t["ts"]), t["what"], t.get("by", "")] for t in inc.get("timeline", [])]
    out += ["<h4>Timeline</h4>", _table(["at (UTC)", "what", "by"], tl) if tl else _empty("No timeline entries.")]
    steps = "".join(f"<li>{escape(step)}</li>" for step in next_checks(inc))
    out += ["<h4>Next checks</h4>", f"<ol>{steps}</ol>"]
    return out


def _affected_lists(hit: view.Affected) -> list[tuple[str, list[str]]]:
    return [("nodes", hit.nodes), ("node pairs", hit.pairs)]  # jobs: their own table


def _ports(data: ReportData, plots: list[Plot]) -> list[str]:
    out = ["<h2>Implicated ports</h2>"]
    if not data.ports:
        why = (
            "No incident in this window."
            if not data.incidents
            else "The evidence names no port with stored throughput series in this window (pair or node signals "
            "are in the pingmesh and NCCL sections)."
        )
        return [*out, _empty(why)]
    out.append(_p("Receive and transmit rates as stored (GET /api/v1/series); the incident is shaded."))
    for panel in data.ports:
        plot = port_plot(panel, data.window, data.shades)
        plots.append(plot)
        out += [f"<h3>{escape(panel.label)}</h3>", _img(plot)]
        if panel.missing:
            out.append(
                _empty(f"No stored series for {', '.join(panel.missing)} (nor the counters it is computed from).")
            )
    return out


def _pingmesh(data: ReportData, plots: list[Plot]) -> list[str]:
    out = ["<h2>Pingmesh</h2>"]
    if not data.pingmesh:
        return [*out, _empty("No pingmesh results in this window.")]
    plot = pingmesh_plot(data.pingmesh, data.query.fabric.nodes_per_leaf)
    plots.append(plot)
    worst = sorted(data.pingmesh, key=lambda c: (-(c.loss_ratio or 0.0), -(c.p99_seconds or 0.0)))[:5]
    rows = [
        [
            c.src,
            c.dst,
            _num(None if c.p99_seconds is None else c.p99_seconds * 1e6),
            "-" if c.loss_ratio is None else f"{c.loss_ratio:.3%}",
        ]
        for c in worst
    ]
    return [
        *out,
        _p(
            f"{len(data.pingmesh)} probed pairs; rows and columns ordered by leaf (lines mark leaf "
            f"boundaries, {data.query.fabric.nodes_per_leaf} nodes per leaf)."
        ),
        _img(plot),
        "<h4>Worst pairs (by loss, then p99)</h4>",
        _table(["source", "destination", "p99 (us)", "loss"], rows, [2, 3]),
    ]


def _nccl(data: ReportData, plots: list[Plot]) -> list[str]:
    out = ["<h2>NCCL tests against the model</h2>"]
    if not data.nccl:
        return [*out, _empty("No NCCL-tests results in this window.")]
    from fabricd.report.nccl import efficiencies, median_busbw

    for curve in data.nccl:
        plot = nccl_plot(curve, curve.model)
        plots.append(plot)
        effs = efficiencies(curve)
        rows = [
            [s, len(m), f"{med / 1e9:.2f}", f"{p / 1e9:.2f}", f"{e:.2f}" if e is not None else "-"]
            for s, m, med, p, e in zip(
                curve.sizes, curve.measured, median_busbw(curve), curve.predicted, effs, strict=True
            )
        ]
        largest = f"{effs[-1]:.2f}" if effs and effs[-1] is not None else "-"
        out += [
            f"<h3>{escape(curve.op)}</h3>",
            _p(
                f"Model: fabricd model (docs/model.md) for {curve.model}; runs of {_nodes(curve.nodes)}. "
                f"Efficiency = measured median ÷ predicted; at the largest size: {largest}."
            ),
            _img(plot),
            _table(
                ["size (bytes)", "runs", "measured busbw (GB/s)", "model busbw (GB/s)", "efficiency"],
                rows,
                [0, 1, 2, 3, 4],
            ),
        ]
    return out


def _nodes(nodes: list[str]) -> str:
    if len(nodes) <= 4:
        return ", ".join(nodes)
    return f"{len(nodes)} nodes ({nodes[0]} … {nodes[-1]})"


def _hot_ports(data: ReportData) -> list[str]:
    out = [f"<h2>Hottest ports (top {data.query.top})</h2>"]
    if not data.hot_ports:
        return [*out, _empty("No port throughput in this window.")]
    rows = [_hot_row(h) for h in data.hot_ports]
    cols = ["node", "device", "port", "rx", "tx", "link", "utilization", "paused", "xmit wait"]
    return [*out, _p("Means over the window, ranked by max(rx, tx)."), _table(cols, rows, [3, 4, 5, 6, 7, 8])]


def _hot_row(h: HotPort) -> list[str]:
    # The same helpers as `fabricd ports` (fabricd/units.py): the two views read alike.
    return [
        h.node,
        h.device,
        h.port or "-",
        units.throughput(h.rx_bytes_per_second),
        units.throughput(h.tx_bytes_per_second),
        units.throughput(h.link_bytes_per_second),
        units.percent(h.utilization),
        units.percent(h.pause_fraction),
        units.rate(h.xmit_wait_per_second, "ticks"),
    ]
