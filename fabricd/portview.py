"""Per-port view for on-call (``GET /api/v1/ports``, ``fabricd ports``): pure, from latest samples.

A port is (node, device, port): an InfiniBand port (``mlx5_0``/``1``) or a network interface
(``eth0``, port empty). Signals are picked by fabricd's vendor-neutral names, so the same code
serves the infiniband, netlink and ethtool collectors:

- throughput: ``port_receive_data``/``port_transmit_data`` (IB, already bytes: the agent multiplies
  the 4-octet words by 4) or ``rx_bytes``/``tx_bytes`` (netlink); the largest source wins;
- errors: the summed rates of counters whose name says error or discard;
- pause fraction: the rate of ``rx_pause_duration`` / ``tx_pause_duration`` in seconds per second
  is the fraction of time paused (mlx5 PPCNT durations are in microseconds, converted at the agent);
  the worst priority is shown;
- xmit wait: ``port_transmit_wait`` ticks per second (the IB congestion signal);
- link rate: ``link_rate`` (IB ``rate`` file) or ethtool ``speed``, in bytes per second.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fabricd.model import Kind, Sample

RX_BYTES = frozenset({"port_receive_data", "legacy_port_receive_data", "rx_bytes"})
TX_BYTES = frozenset({"port_transmit_data", "legacy_port_transmit_data", "tx_bytes"})
PAUSE = frozenset({"rx_pause_duration", "tx_pause_duration"})
XMIT_WAIT = frozenset({"port_transmit_wait"})
LINK_RATE = frozenset({"link_rate", "speed"})


@dataclass(slots=True)
class PortView:
    node: str
    device: str
    port: str
    state: str = ""
    rx: float | None = None
    tx: float | None = None
    link: float | None = None
    errors: float = 0.0
    pause: float | None = None
    xmit_wait: float | None = None
    updated_ts: float = 0.0

    @property
    def utilization(self) -> float | None:
        if not self.link:
            return None
        return max(self.rx or 0.0, self.tx or 0.0) / self.link

    def sort_value(self, key: str) -> float:
        values = {
            "throughput": max(self.rx or 0.0, self.tx or 0.0),
            "utilization": self.utilization or 0.0,
            "errors": self.errors,
            "pause": self.pause or 0.0,
            "xmit_wait": self.xmit_wait or 0.0,
        }
        return values[key]


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _is_error(name: str) -> bool:
    return "error" in name or "discard" in name


def _apply(view: PortView, s: Sample) -> None:
    r = s.reading
    name = r.metric
    view.updated_ts = max(view.updated_ts, s.ts)
    if r.kind is Kind.INFO:
        state = dict(r.labels).get("state", "")
        view.state = state or view.state
    elif name in RX_BYTES:
        view.rx = _max(view.rx, s.rate)
    elif name in TX_BYTES:
        view.tx = _max(view.tx, s.rate)
    elif name in PAUSE:
        view.pause = _max(view.pause, s.rate)
    elif name in XMIT_WAIT:
        view.xmit_wait = _max(view.xmit_wait, s.rate)
    elif name in LINK_RATE and r.kind is Kind.GAUGE:
        view.link = _max(view.link, r.value)
    elif name == "link_detected" and not view.state:
        view.state = "up" if r.value else "down"
    elif r.kind is Kind.COUNTER and _is_error(name) and s.rate is not None:
        view.errors += s.rate


def port_views(latest: Iterable[tuple[str, Sample]]) -> list[PortView]:
    """Group the latest samples by (node, device, port) and read each port's signals."""
    views: dict[tuple[str, str, str], PortView] = {}
    for node, s in latest:
        r = s.reading
        if r.source not in ("infiniband", "netlink", "ethtool") or not r.device:
            continue
        key = (node, r.device, r.port)
        view = views.get(key) or views.setdefault(key, PortView(node, r.device, r.port))
        _apply(view, s)
    return list(views.values())


def select_ports(views: list[PortView], state: str | None, sort: str, limit: int) -> list[PortView]:
    if state:
        views = [v for v in views if v.state.lower() == state.lower()]
    if sort == "name":
        return sorted(views, key=lambda v: (v.node, v.device, v.port))[:limit]
    return sorted(views, key=lambda v: (-v.sort_value(sort), v.node, v.device, v.port))[:limit]
