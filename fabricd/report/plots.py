"""The report's plots: matplotlib figures (Agg, no pyplot) rendered to PNG bytes.

Each plot returns a ``Plot`` that keeps, next to the PNG, the arrays it drew (``data``), so a test
or a reader of the report can check that what is on the picture is what the store holds. Plots are
drawn without pyplot's global figure registry and under one lock: matplotlib is not thread-safe,
and the server renders reports in its thread pool.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from io import BytesIO
from typing import Any

from fabricd.perfmodel import GBIT  # bytes/s in one Gb/s: throughput in the unit of link rates
from fabricd.report.data import NcclCurve, PingCell, PortPanel, Shade, Window

DPI = 100
_LOCK = threading.Lock()
# Leaf of a node in fabricd's naming (``node-007``: 1-based, ``nodes_per_leaf`` consecutive nodes per leaf,
# fabricd/topology.py fat_tree); names that do not follow it still sort, just without leaf lines.
_NODE_NUMBER = re.compile(r"(\d+)$")


@dataclass
class Plot:
    name: str  # file name stem: "port-node-003-mlx5_1-1", "pingmesh", "nccl"
    title: str
    png: bytes
    data: dict[str, Any] = field(default_factory=dict)  # what was drawn, in stored units


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _png(fig: Any) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    out = BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def _utc(ts: Sequence[float]) -> list[datetime]:
    return [datetime.fromtimestamp(t, tz=UTC) for t in ts]


def _nan(values: Sequence[float | None], scale: float = 1.0) -> list[float]:
    return [math.nan if v is None else v / scale for v in values]


def _time_axis(ax: Any, window: Window, shades: Sequence[Shade], bottom: bool = True) -> None:
    import matplotlib.dates as mdates

    for s in shades:
        ax.axvspan(*_utc([s.start, s.end]), color="tab:red", alpha=0.12, label=f"incident {s.label}")
    ax.set_xlim(*_utc([window.start, window.end]))
    locator = mdates.AutoDateLocator(tz=UTC)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))
    if bottom:
        ax.set_xlabel("time (UTC)")
    ax.grid(True, alpha=0.3)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def port_plot(panel: PortPanel, window: Window, shades: Sequence[Shade]) -> Plot:
    """Rx/tx throughput (Gb/s) and, below, each evidence signal's stored series."""
    rows = 1 + len(panel.signals)
    with _LOCK:
        fig = _figure(9, 2.6 * rows)
        axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
        drawn: dict[str, Any] = {}
        for s in panel.throughput:
            axes[0].plot(_utc(s.ts), _nan(s.values, GBIT), label=s.name, linewidth=1.2)
            drawn[s.name] = {"ts": list(s.ts), "values": list(s.values), "unit": f"{s.unit}/s"}
        axes[0].set_ylabel("throughput (Gb/s)")
        axes[0].set_title(f"{panel.label}: throughput")
        for ax, s in zip(axes[1:], panel.signals, strict=True):
            key = f"signal:{s.name}"
            ax.plot(_utc(s.ts), _nan(s.values), color="tab:purple", linewidth=1.2, label=s.name)
            ax.set_ylabel(_unit_label(s.unit, s.kind))
            ax.set_title(f"{panel.label}: {s.name}" + (" (rate)" if s.kind == "counter" else ""))
            drawn[key] = {"ts": list(s.ts), "values": list(s.values), "unit": _unit_label(s.unit, s.kind)}
        for i, ax in enumerate(axes):
            _time_axis(ax, window, shades, bottom=i == len(axes) - 1)
            ax.legend(loc="upper right", fontsize="small")
        png = _png(fig)
    return Plot(f"port-{_slug(panel.label)}", f"{panel.label}", png, drawn)


def _unit_label(unit: str, kind: str) -> str:
    if kind == "counter":
        return f"{unit or 'events'}/s"
    return unit or "value"


def node_order(nodes: Iterable[str]) -> list[str]:
    """Natural order: ``node-2`` before ``node-10``; fabricd numbers nodes leaf by leaf."""
    return sorted(nodes, key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)])


def leaf_breaks(nodes: Sequence[str], nodes_per_leaf: int) -> list[int]:
    """Indexes where a new leaf starts in ``nodes`` (already ordered), from the node numbers."""
    leaves = []
    for n in nodes:
        m = _NODE_NUMBER.search(n)
        leaves.append((int(m.group(1)) - 1) // nodes_per_leaf if m and nodes_per_leaf > 0 else None)
    return [i for i in range(1, len(nodes)) if leaves[i] is not None and leaves[i] != leaves[i - 1]]


def pingmesh_plot(cells: Sequence[PingCell], nodes_per_leaf: int) -> Plot:
    """Two src x dst heatmaps, rows and columns ordered by leaf: worst p99 RTT (us) and loss (%)."""
    import numpy as np

    nodes = node_order({c.src for c in cells} | {c.dst for c in cells})
    index = {n: i for i, n in enumerate(nodes)}
    p99 = np.full((len(nodes), len(nodes)), np.nan)
    loss = np.full((len(nodes), len(nodes)), np.nan)
    for c in cells:
        if c.p99_seconds is not None:
            p99[index[c.src], index[c.dst]] = c.p99_seconds * 1e6
        if c.loss_ratio is not None:
            loss[index[c.src], index[c.dst]] = c.loss_ratio * 100
    breaks = leaf_breaks(nodes, nodes_per_leaf)
    side = min(7.0, 2.5 + 0.25 * len(nodes))
    with _LOCK:
        fig = _figure(2 * side + 1.5, side)
        for ax, matrix, title, unit, cmap in zip(
            fig.subplots(1, 2),
            (p99, loss),
            ("worst p99 RTT", "probe loss"),
            ("us", "%"),
            ("viridis", "Reds"),
            strict=True,
        ):
            _heatmap(fig, ax, matrix, nodes, breaks, f"{title} ({unit})", cmap)
        png = _png(fig)
    data = {"nodes": nodes, "p99_us": p99.tolist(), "loss_percent": loss.tolist(), "leaf_breaks": breaks}
    return Plot("pingmesh", "Pingmesh", png, data)


def _heatmap(
    fig: Any, ax: Any, matrix: Any, nodes: Sequence[str], breaks: Sequence[int], title: str, cmap: str
) -> None:
    import numpy as np

    finite = matrix[np.isfinite(matrix)]
    vmax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap, vmin=0.0, vmax=vmax, interpolation="nearest")
    fig.colorbar(image, ax=ax, shrink=0.8, label=title)
    ticks = range(len(nodes))
    ax.set_xticks(list(ticks), nodes, rotation=90, fontsize="x-small")
    ax.set_yticks(list(ticks), nodes, fontsize="x-small")
    for b in breaks:  # leaf boundaries
        ax.axhline(b - 0.5, color="black", linewidth=0.8)
        ax.axvline(b - 0.5, color="black", linewidth=0.8)
    ax.set_xlabel("destination (probed peer)")
    ax.set_ylabel("source (prober)")
    ax.set_title(title)


def human_bytes(n: float) -> str:
    """Binary multiples, as nccl-tests sizes are given (8, 64K, 1M, 8G)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def nccl_plot(curve: NcclCurve, label: str) -> Plot:
    """Measured out-of-place busbw (every run, median line) vs the model, GB/s against message size."""
    from fabricd.report.nccl import median_busbw

    medians = median_busbw(curve)
    with _LOCK:
        fig = _figure(8, 4.5)
        ax = fig.subplots()
        xs = [s for s, runs in zip(curve.sizes, curve.measured, strict=True) for _ in runs]
        ys = [b / 1e9 for runs in curve.measured for b in runs]
        ax.scatter(xs, ys, s=10, alpha=0.35, color="tab:blue", label="measured (each run)")
        ax.plot(curve.sizes, [m / 1e9 for m in medians], marker="o", color="tab:blue", label="measured median")
        ax.plot(
            curve.sizes,
            [p / 1e9 for p in curve.predicted],
            linestyle="--",
            color="tab:orange",
            label=f"model ({label})",
        )
        ax.set_xscale("log", base=2)
        ax.set_xticks(curve.sizes, [human_bytes(b) for b in curve.sizes])
        ax.minorticks_off()
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"NCCL {curve.op}: busbw vs size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
        png = _png(fig)
    data = {
        "sizes": list(curve.sizes),
        "measured_median": medians,
        "predicted": list(curve.predicted),
        "unit": "bytes/s",
    }
    return Plot(curve.plot_name or f"nccl-{curve.op}", f"NCCL {curve.op}", png, data)
