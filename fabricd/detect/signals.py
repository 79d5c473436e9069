"""From samples to detector signals: one scrape of one device at a time, in event time.

Samples of one (node, source, device) that share a scrape (timestamps within ``tolerance``) are
gathered in a ``Record``; when the scrape is complete the record is turned into signals (ratios need
numerator and denominator from the same scrape). A rate of ``None`` (first sighting, reset,
saturated counter: ``fabricd.counters``) contributes nothing: a saturated counter can never raise an
incident, it only stops informing one.

Signals computed here (names used by ``rules/detection/*.yaml``), per HCA port unless noted:

============================  ===========================================================  =========
signal                        definition                                                   unit
============================  ===========================================================  =========
ecn_marked_fraction           rate(np_ecn_marked_roce_packets) / rate(port_rcv_packets)    ratio
cnp_sent_rate                 rate(np_cnp_sent) (we are a congested receiver)              1/s
cnp_handled_rate              rate(rp_cnp_handled) (we are a throttled sender)             1/s
xmit_wait_fraction            rate(port_xmit_wait) x 8 bytes / link rate (lost bandwidth)  ratio
qdisc_backlog_bytes           qdisc backlog (gauge), per qdisc                             bytes
qdisc_overlimit_rate          rate(qdisc overlimits), per qdisc                            1/s
rx_pause_fraction             rate(rx_pause_duration), per priority (paused by the peer)   ratio
tx_pause_fraction             rate(tx_pause_duration), per priority (we pause the peer)    ratio
pause_storm_rate              rate(tx_pause_storm_warning_events + ..._error_events)       1/s
phy_error_rate                symbol_error + port_rcv_errors + rx_crc_errors + symbols     1/s
discard_rate                  port_xmit_discards + rx/tx_discards + qdisc drops            1/s
seq_error_rate                out_of_sequence + packet_seq_err + implied_nak_seq_err       1/s
retransmit_rate               roce_adp_retrans(+_to) + local_ack_timeout_err               1/s
link_down_rate                link_downed + link_down_events + carrier_changes + state     1/s
probe_loss_fraction           rate(probes_lost) / rate(probes_sent), per (node, peer)      ratio
rtt_p99                       pingmesh p99 RTT per (node, peer) -> latency baselines       s
nccl_time                     NCCL-tests time per (node, op, size) -> latency baselines    s
nccl_efficiency_sustained     best derived ``nccl_efficiency`` (measured / model busbw) of  ratio
                              the node's last 3 runs per (op, size): below a level only
                              when every one of them was (3 consecutive runs)
============================  ===========================================================  =========

Context kept with each port (not a rule signal): ``utilization`` = rate(port_xmit_data) / link
rate, and ``rx_utilization`` likewise; evidence shows it so "busy" and "congested" are told apart.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from fabricd.model import Kind, Labels, Sample

IB, ETHTOOL, NETLINK, PINGMESH, NCCL = "infiniband", "ethtool", "netlink", "pingmesh", "nccl"
DERIVED = "derived"  # signals the agent computed (fabricd.derived); only nccl_efficiency is read here
SOURCES = frozenset({IB, ETHTOOL, NETLINK, PINGMESH, NCCL, DERIVED})
# DOMAIN.md: on Quantum switch ports lost bytes ~ delta(port_xmit_wait) x 8 (fabricd.derived agrees).
XMIT_WAIT_BYTES_PER_TICK = 8.0
IB_PORT_ACTIVE = 4.0  # sysfs ``state``: "4: ACTIVE"
NO_PRIORITY: Labels = ()
# Runs an efficiency drop must last: a healthy node paired once with a slow one is low for one run
# (jobs rotate their members), a straggler is low in every run it joins.
EFFICIENCY_RUNS = 3

SIGNALS: dict[str, str] = {
    "ecn_marked_fraction": "ratio of received RoCE packets carrying ECN CE",
    "cnp_sent_rate": "congestion notification packets sent per second (congested receiver)",
    "cnp_handled_rate": "congestion notification packets handled per second (throttled sender)",
    "xmit_wait_fraction": "bandwidth lost to XmitWait as a fraction of the link rate",
    "qdisc_backlog_bytes": "bytes queued in a qdisc",
    "qdisc_overlimit_rate": "qdisc overlimit events per second (shaper throttling)",
    "rx_pause_fraction": "fraction of time paused by the link partner, per priority",
    "tx_pause_fraction": "fraction of time this port paused its link partner, per priority",
    "pause_storm_rate": "pause storm warning/error events per second",
    "phy_error_rate": "symbol, CRC and receive errors per second",
    "discard_rate": "discarded packets per second (port, NIC and qdisc drops)",
    "seq_error_rate": "transport sequence errors per second (packets lost in flight)",
    "retransmit_rate": "RoCE retransmissions and ack timeouts per second",
    "link_down_rate": "link down events per second (link_downed, carrier changes, state toggles)",
    "probe_loss_fraction": "fraction of pingmesh probes lost, per node pair",
    "rtt_p99_outlier": "pingmesh p99 RTT against its robust baselines (score)",
    "nccl_time_outlier": "NCCL-tests time against its robust baselines (score)",
    "nccl_efficiency_sustained": f"best NCCL-tests efficiency (measured / model busbw) of the node's last "
    f"{EFFICIENCY_RUNS} runs, per op and size",
}

PHY_ERRORS = ("symbol_error", "port_rcv_errors", "rx_crc_errors", "rx_symbol_errors")
DISCARDS = ("port_xmit_discards", "rx_discards", "tx_discards")
SEQ_ERRORS = ("out_of_sequence", "packet_seq_err", "implied_nak_seq_err")
RETRANSMITS = ("roce_adp_retrans", "roce_adp_retrans_to", "local_ack_timeout_err")
LINK_DOWNS = ("link_downed", "link_down_events", "carrier_changes")

# The metrics each source handler reads; everything else is skipped before it costs anything.
WANTED: dict[str, frozenset[str]] = {
    IB: frozenset(
        {
            "port_rcv_packets",
            "np_ecn_marked_roce_packets",
            "np_cnp_sent",
            "rp_cnp_handled",
            "port_xmit_wait",
            "rate",
            "state",
            "port_xmit_data",
            "port_rcv_data",
            *PHY_ERRORS,
            *DISCARDS,
            *SEQ_ERRORS,
            *RETRANSMITS,
            *LINK_DOWNS,
        }
    ),
    ETHTOOL: frozenset(
        {
            "rx_pause_duration",
            "tx_pause_duration",
            "tx_pause_storm_warning_events",
            "tx_pause_storm_error_events",
            *PHY_ERRORS,
            *DISCARDS,
            *LINK_DOWNS,
        }
    ),
    NETLINK: frozenset({"qdisc_backlog_bytes", "qdisc_overlimits", "qdisc_drops", "carrier_changes"}),
    PINGMESH: frozenset({"probes_sent", "probes_lost", "rtt_p99"}),
    NCCL: frozenset({"time"}),
    DERIVED: frozenset({"nccl_efficiency"}),
}
RAW_NAMED = frozenset({IB, PINGMESH, NCCL, DERIVED})  # sources whose raw counter name is the detector's key

# name -> (metric, port, labels) values of one scrape; counters hold their rate (or None).
ValueKey = tuple[str, str, Labels]
Emit = Callable[[str, str, str, str, Labels, float, float], None]  # signal, node, dev, port, labels, ts, v


@dataclass(slots=True)
class Record:
    """One scrape of one (node, source, device): metric values keyed by (metric, port, labels)."""

    node: str
    source: str
    device: str
    ts: float
    values: dict[ValueKey, float | None] = field(default_factory=dict)
    dirty: bool = False

    def get(self, metric: str, port: str) -> float | None:
        v = self.values.get((metric, port, ()))
        if v is None and port:
            v = self.values.get((metric, "", ()))  # device-level hw_counters (no port folder)
        return v

    def total(self, metrics: tuple[str, ...], port: str) -> float | None:
        """Sum of the metrics that have a rate; None when none has (all saturated or absent)."""
        found = [v for m in metrics if (v := self.get(m, port)) is not None]
        return sum(found) if found else None

    def ports(self) -> list[str]:
        named = sorted({p for (_, p, _) in self.values if p})
        return named or [""]


def metric_of(sample: Sample) -> str:
    """The name detectors key on: raw sysfs names for InfiniBand (the kernel ABI), fabricd's
    vendor-neutral names for ethtool (``rx_pause_duration``) and netlink qdiscs (``qdisc_drops``)."""
    r = sample.reading
    if r.source in RAW_NAMED:
        return r.counter
    return r.name or r.counter


def value_of(sample: Sample) -> float | None:
    return sample.rate if sample.reading.kind is Kind.COUNTER else sample.reading.value


@dataclass(slots=True)
class PortContext:
    """What persists between scrapes for one port: link rate, IB state, last utilization."""

    link_rate: float | None = None
    state: float | None = None
    utilization: float | None = None
    rx_utilization: float | None = None


class Extractor:
    """Turns completed records into signals through ``emit``; keeps per-port context."""

    def __init__(self, emit: Emit, min_packets_per_second: float = 1000.0) -> None:
        self.emit = emit
        self.min_pps = min_packets_per_second  # below this an ECN ratio is noise
        self.ports: dict[tuple[str, str, str], PortContext] = {}
        self.efficiency: dict[tuple[str, str, Labels], deque[float]] = {}  # (node, op, size) -> last runs

    def flush(self, rec: Record) -> None:
        handler = _HANDLERS.get(rec.source)
        if handler is not None:
            handler(self, rec)
        rec.values.clear()
        rec.dirty = False

    def context(self, node: str, device: str, port: str) -> PortContext:
        key = (node, device, port)
        ctx = self.ports.get(key)
        if ctx is None:
            ctx = self.ports[key] = PortContext()
        return ctx

    # --- InfiniBand sysfs (counters/ and hw_counters/) -------------------------------------------

    def infiniband(self, rec: Record) -> None:
        for port in rec.ports():
            self._ib_port(rec, port)

    def _ib_port(self, rec: Record, port: str) -> None:
        node, dev, ts, emit = rec.node, rec.device, rec.ts, self.emit
        ctx = self.context(node, dev, port)
        down = self._ib_context(rec, port, ctx)
        rcv_pps = rec.get("port_rcv_packets", port)
        ecn = rec.get("np_ecn_marked_roce_packets", port)
        if ecn is not None and rcv_pps is not None and rcv_pps >= self.min_pps:
            emit("ecn_marked_fraction", node, dev, port, NO_PRIORITY, ts, min(1.0, ecn / rcv_pps))
        for metric, signal in (("np_cnp_sent", "cnp_sent_rate"), ("rp_cnp_handled", "cnp_handled_rate")):
            v = rec.get(metric, port)
            if v is not None:
                emit(signal, node, dev, port, NO_PRIORITY, ts, v)
        wait = rec.get("port_xmit_wait", port)
        if wait is not None and ctx.link_rate:
            emit(
                "xmit_wait_fraction",
                node,
                dev,
                port,
                NO_PRIORITY,
                ts,
                min(1.0, wait * XMIT_WAIT_BYTES_PER_TICK / ctx.link_rate),
            )
        self._errors(rec, port, down)

    def _ib_context(self, rec: Record, port: str, ctx: PortContext) -> float:
        """Update the port's context; returns 1.0 when the port was seen down or toggling."""
        rate = rec.get("rate", port)
        if rate:
            ctx.link_rate = rate
        tx, rx = rec.get("port_xmit_data", port), rec.get("port_rcv_data", port)
        if ctx.link_rate:
            ctx.utilization = None if tx is None else tx / ctx.link_rate
            ctx.rx_utilization = None if rx is None else rx / ctx.link_rate
        state = rec.get("state", port)
        if state is not None:
            toggled = ctx.state is not None and (state == IB_PORT_ACTIVE) != (ctx.state == IB_PORT_ACTIVE)
            ctx.state = state
            # A port seen down, or seen changing state, is a flap even when link_downed is
            # saturated (8 bits: it stops at 255) or the toggle fell between two scrapes.
            return 1.0 if toggled or state != IB_PORT_ACTIVE else 0.0
        return 0.0

    def _errors(self, rec: Record, port: str, down: float = 0.0) -> None:
        for metrics, signal in (
            (PHY_ERRORS, "phy_error_rate"),
            (DISCARDS, "discard_rate"),
            (SEQ_ERRORS, "seq_error_rate"),
            (RETRANSMITS, "retransmit_rate"),
        ):
            v = rec.total(metrics, port)
            if v is not None:
                self.emit(signal, rec.node, rec.device, port, NO_PRIORITY, rec.ts, v)
        downs = rec.total(LINK_DOWNS, port)
        if downs is not None or down:
            self.emit("link_down_rate", rec.node, rec.device, port, NO_PRIORITY, rec.ts, (downs or 0.0) + down)

    # --- ethtool (vendor-neutral names) ------------------------------------------------------------

    def ethtool(self, rec: Record) -> None:
        node, dev, ts = rec.node, rec.device, rec.ts
        for (metric, _, labels), v in rec.values.items():
            if v is None:
                continue
            if metric == "rx_pause_duration":
                self.emit("rx_pause_fraction", node, dev, "", labels, ts, min(1.0, v))
            elif metric == "tx_pause_duration":
                self.emit("tx_pause_fraction", node, dev, "", labels, ts, min(1.0, v))
        storms = rec.total(("tx_pause_storm_warning_events", "tx_pause_storm_error_events"), "")
        if storms is not None:
            self.emit("pause_storm_rate", node, dev, "", NO_PRIORITY, ts, storms)
        self._errors(rec, "")

    # --- netlink (interfaces and qdiscs) ------------------------------------------------------------

    def netlink(self, rec: Record) -> None:
        node, dev, ts = rec.node, rec.device, rec.ts
        for (metric, _, labels), v in rec.values.items():
            if v is None or not labels:
                continue
            if metric == "qdisc_backlog_bytes":
                self.emit("qdisc_backlog_bytes", node, dev, "", labels, ts, v)
            elif metric == "qdisc_overlimits":
                self.emit("qdisc_overlimit_rate", node, dev, "", labels, ts, v)
            elif metric == "qdisc_drops":
                self.emit("discard_rate", node, dev, "", labels, ts, v)
        changes = rec.get("carrier_changes", "")
        if changes is not None:
            self.emit("link_down_rate", node, dev, "", NO_PRIORITY, ts, changes)

    # --- pingmesh (device = peer) and NCCL (device = op) -----------------------------------------

    def pingmesh(self, rec: Record) -> None:
        sent, lost = rec.get("probes_sent", ""), rec.get("probes_lost", "")
        if sent and lost is not None:
            self.emit("probe_loss_fraction", rec.node, rec.device, "", NO_PRIORITY, rec.ts, min(1.0, lost / sent))
        p99 = rec.get("rtt_p99", "")
        if p99 is not None:
            self.emit("rtt_p99", rec.node, rec.device, "", NO_PRIORITY, rec.ts, p99)

    def nccl(self, rec: Record) -> None:
        for (metric, _, labels), v in rec.values.items():
            if metric == "time" and v is not None:
                self.emit("nccl_time", rec.node, rec.device, "", labels, rec.ts, v)

    # --- derived (agent-computed): NCCL-tests efficiency against the performance model -------------

    def derived(self, rec: Record) -> None:
        for (metric, _, labels), v in rec.values.items():
            if metric != "nccl_efficiency" or v is None:
                continue
            key = (rec.node, rec.device, labels)
            runs = self.efficiency.get(key)
            if runs is None:
                runs = self.efficiency[key] = deque(maxlen=EFFICIENCY_RUNS)
            runs.append(v)
            if len(runs) == EFFICIENCY_RUNS:  # the best of the last runs: low only if all of them were
                self.emit("nccl_efficiency_sustained", rec.node, rec.device, "", labels, rec.ts, max(runs))


_HANDLERS: dict[str, Callable[[Extractor, Record], None]] = {
    IB: Extractor.infiniband,
    ETHTOOL: Extractor.ethtool,
    NETLINK: Extractor.netlink,
    PINGMESH: Extractor.pingmesh,
    NCCL: Extractor.nccl,
    DERIVED: Extractor.derived,
}
