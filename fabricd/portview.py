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

One port, one identity: a RoCE port is an RDMA device port (sysfs counters) *and* a network
interface (ethtool, netlink). The infiniband collector names the port's netdev (``port_info`` label
``netdev``, from sysfs ``gid_attrs/ndevs``); the interface's readings join that port's row, so the
port is listed once, with its pause fraction (ethtool) next to its state and rate (sysfs).
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
PORT_SOURCES = frozenset({"infiniband", "netlink", "ethtool"})


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
    netdev: str = ""  # the network interface of a RoCE port (joined from sysfs), "" otherwise

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
    """Group the latest samples by port and read each port's signals: (node, device, port), with a
    RoCE port's network interface folded into its RDMA port."""
    samples = [(node, s) for node, s in latest if s.reading.source in PORT_SOURCES and s.reading.device]
    netdevs: dict[tuple[str, str], tuple[str, str]] = {}  # (node, netdev) -> its RDMA port
    ports: dict[tuple[str, str], set[str]] = {}  # (node, RDMA device) -> its port numbers
    for node, s in samples:
        r = s.reading
        if r.source == "infiniband" and r.port:
            ports.setdefault((node, r.device), set()).add(r.port)
            if r.name == "port_info" and (netdev := dict(r.labels).get("netdev")):
                netdevs[(node, netdev)] = (r.device, r.port)
    port_of = dict(netdevs)  # (node, netdev or RDMA device) -> the port its readings belong to
    for (node, device), numbers in ports.items():
        if len(numbers) == 1:  # device-level readings (INFO, hw_counters) belong to its one port
            port_of.setdefault((node, device), (device, next(iter(numbers))))
    views: dict[tuple[str, str, str], PortView] = {}
    for node, s in samples:
        r = s.reading
        if r.source == "infiniband" and r.port:
            device, port = r.device, r.port
        elif (node, r.device) in port_of:
            device, port = port_of[(node, r.device)]
        elif r.source == "infiniband":
            continue  # device-level readings of a multi-port device: no one port to show them on
        else:
            device, port = r.device, r.port
        key = (node, device, port)
        view = views.get(key) or views.setdefault(key, PortView(node, device, port))
        _apply(view, s)
    for (node, netdev), (rdma, number) in netdevs.items():
        if (joined := views.get((node, rdma, number))) is not None:
            joined.netdev = netdev
    return list(views.values())


def select_ports(views: list[PortView], state: str | None, sort: str, limit: int) -> list[PortView]:
    if state:
        views = [v for v in views if v.state.lower() == state.lower()]
    if sort == "name":
        return sorted(views, key=lambda v: (v.node, v.device, v.port))[:limit]
    return sorted(views, key=lambda v: (-v.sort_value(sort), v.node, v.device, v.port))[:limit]
