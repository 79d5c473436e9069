"""The values a report is made of: what was asked (``ReportQuery``) and what was found (``ReportData``).

Everything here is plain data: gathering fills it from a ``Source``, rendering draws it. A section
with nothing in it is an empty list, and the renderer says so instead of drawing an empty plot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fabricd.perfmodel import Fabric

DEFAULT_PAD_SECONDS = 600.0  # context shown before an incident starts and after it ends


@dataclass(frozen=True)
class ReportQuery:
    """One incident (``incident_id``) or a time range (``since``/``until``, epoch seconds)."""

    incident_id: int | None = None
    since: float | None = None
    until: float | None = None
    pad_seconds: float = DEFAULT_PAD_SECONDS
    top: int = 10  # rows of the hottest-ports table
    max_ports: int = 6  # implicated ports plotted
    max_incidents: int = 20  # incidents summarized in a range report
    fabric: Fabric = field(default_factory=Fabric)
    nccl_nodes: int = 2  # nodes in one NCCL-tests job, when a run does not say (or with hardware "flags")
    # The NCCL model's hardware: "nodes" = each node's own ports as stored from its sysfs and each run's
    # job shape (fabricd/report/nccl.py); "flags" = ``fabric`` and ``nccl_nodes`` for every run.
    hardware: str = "nodes"

    def __post_init__(self) -> None:
        if (self.incident_id is None) == (self.since is None):
            raise ValueError("a report is for one incident or for a time range (since), not both or neither")
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise ValueError("until must be after since")
        _check_fabric(self.fabric)
        if self.hardware not in ("nodes", "flags"):
            raise ValueError(f"hardware must be nodes or flags, not {self.hardware!r}")
        if self.nccl_nodes < 1 or self.pad_seconds < 0 or self.top < 1 or self.max_ports < 0:
            raise ValueError("nccl nodes and top must be at least 1, pad and max ports not negative")


def _check_fabric(f: Fabric) -> None:
    """The model divides by these: a zero or non-finite one would fail the whole report."""
    rates = (f.link_rate_bytes_per_second, f.nvlink_bytes_per_second)
    if not all(math.isfinite(r) and r > 0 for r in rates):
        raise ValueError("link rates must be positive, e.g. 400G")
    if min(f.hcas_per_node, f.gpus_per_node, f.nodes_per_leaf) < 1:
        raise ValueError("HCAs per node, GPUs per node and nodes per leaf must be at least 1")
    if not (
        0 < f.efficiency <= 1
        and math.isfinite(f.alpha_seconds)
        and f.alpha_seconds >= 0
        and math.isfinite(f.oversubscription)
        and f.oversubscription > 0
    ):
        raise ValueError("efficiency must be in (0, 1], alpha not negative, oversubscription positive")


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Shade:
    """A time span shaded on the rate plots: an incident from its start to its end (or now)."""

    start: float
    end: float
    label: str


@dataclass
class Series:
    """One stored series over the window, as ``GET /api/v1/series`` returned it.

    ``values`` are the plotted numbers: the per-second ``rate`` for counters (None where the agent
    had no honest rate: first sighting, reset, saturation) and the ``value`` for gauges."""

    node: str
    device: str
    port: str
    name: str
    unit: str
    kind: str
    step_seconds: float | None
    ts: list[float] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.node}/{self.device}/{self.port}" if self.port else f"{self.node}/{self.device}"


@dataclass
class PortPanel:
    """An implicated port: its throughput and the stored series of the signals that fired on it."""

    node: str
    device: str
    port: str
    throughput: list[Series] = field(default_factory=list)
    signals: list[Series] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # signals with no stored series (detector-internal)

    @property
    def label(self) -> str:
        return "/".join(p for p in (self.node, self.device, self.port) if p)


@dataclass(frozen=True)
class PingCell:
    src: str
    dst: str
    p99_seconds: float | None  # the worst p99 RTT reported in the window
    loss_ratio: float | None  # probes never answered (lost less late) / sent over the window


@dataclass
class NcclCurve:
    """Measured out-of-place busbw per size for one collective, and the model's prediction."""

    op: str
    sizes: list[int] = field(default_factory=list)
    measured: list[list[float]] = field(default_factory=list)  # bytes/s, every run in the window, per size
    predicted: list[float] = field(default_factory=list)  # bytes/s per size
    model: str = ""  # the model the prediction used, in words (fabricd/report/nccl.py RunModel.describe)
    nodes: list[str] = field(default_factory=list)  # the nodes whose runs this curve holds
    plot_name: str = ""  # nccl-<op>, nccl-<op>-2 when one op has runs under several models


@dataclass(frozen=True)
class HotPort:
    node: str
    device: str
    port: str
    rx_bytes_per_second: float | None
    tx_bytes_per_second: float | None
    link_bytes_per_second: float | None
    utilization: float | None
    pause_fraction: float | None
    xmit_wait_per_second: float | None


@dataclass
class ReportData:
    title: str
    window: Window
    generated_ts: float
    query: ReportQuery
    incidents: list[dict[str, Any]] = field(default_factory=list)  # GET /api/v1/incidents/{id} JSON
    shades: list[Shade] = field(default_factory=list)
    ports: list[PortPanel] = field(default_factory=list)
    pingmesh: list[PingCell] = field(default_factory=list)
    nccl: list[NcclCurve] = field(default_factory=list)
    hot_ports: list[HotPort] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # truncations and other caveats, shown in the report
