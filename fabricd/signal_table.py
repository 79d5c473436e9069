"""The signal table: every derived signal fabricd computes, defined once, computed by one function.

Read by the agent (``fabricd/derived.py``: ``fabricd_derived_<name>`` gauges), the detectors
(``fabricd/detect/signals.py``: the signals ``rules/detection/*.yaml`` name), the report
(``fabricd/report/gather.py``: the value plotted for an incident's evidence), the metric catalogue
and the dashboard generator. Each consumer gathers the inputs of one *scope* (a port, an interface,
a qdisc, a priority, a probed peer: ``fabricd.signal_math.scopes``) from its own data, the same way, and calls the
signal's ``compute``: the agent's exported ECN ratio, the incident's evidence and the report's plot
are the same number for the same samples (``tests/test_signal_agreement.py``).

Inputs are neutral names (``fabricd.drivers.vocabulary``): counters give their rate (only honest
ones: OK or WRAPPED; a saturated or reset counter gives nothing), gauges their value. An input slot
lists alternatives, the first present wins (mlx5 ``port_receive_packets`` from the PMA; bnxt_re,
which has no PMA, its RoCE packet count). ``port_down`` is the central's own context (the port was
seen not ACTIVE, or changing state, since the last scrape), not a reading.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fabricd.drivers import ethtool as eth
from fabricd.drivers import ib
from fabricd.drivers.ib import pma
from fabricd.drivers.vocabulary import PORT as PORT_ATTRIBUTES
from fabricd.signal_math import (
    Slot,
    Values,
    ecn_marked_ratio,
    first,
    loss_ratio,
    per_gigabyte,
    ratio01,
    total,
    value,
    xmit_wait_lost_bytes_per_second,
    xmit_wait_ratio,
)

Compute = Callable[[Sequence[float | None]], float | None]

IB, ETHTOOL, NETLINK, PINGMESH, NCCL, DERIVED = "infiniband", "ethtool", "netlink", "pingmesh", "nccl", "derived"

RECEIVED_PACKETS: Slot = ("port_receive_packets", "rdma_rx_packets", "rx_unicast_packets")
RECEIVED_BYTES: Slot = ("port_receive_data", "rdma_rx_bytes", "rx_unicast_bytes")
SENT_BYTES: Slot = ("port_transmit_data", "rdma_tx_bytes", "tx_unicast_bytes")
PHY_ERRORS = ("symbol_errors", "port_receive_errors", "rx_crc_errors", "rx_symbol_errors")
DISCARDS = (
    "port_transmit_discards",
    "rx_discards",
    "tx_discards",
    "qdisc_drops",
    "rdma_rx_discards",
    "rdma_tx_discards",
)
SEQ_ERRORS = ("out_of_sequence_packets", "rx_sequence_error_naks", "implied_nak_sequence_errors")
RETRANSMITS = ("roce_adaptive_retransmissions", "roce_adaptive_retransmission_timeouts", "local_ack_timeouts")
LINK_DOWNS = ("link_downed", "link_down_events", "carrier_changes", "port_down")
PAUSE_STORMS = ("tx_pause_storm_warning_events", "tx_pause_storm_error_events")


@dataclass(frozen=True)
class Signal:
    """One signal. ``compute`` is None for the stateful ones the detection engine keeps itself
    (robust baselines, run history); ``agent``: exported by the agent as ``fabricd_derived_<name>``;
    ``central``: a detector signal that rules may name."""

    name: str
    unit: str
    help: str
    formula: str
    inputs: tuple[Slot, ...]
    compute: Compute | None
    agent: bool = True
    central: bool = True
    labels: tuple[str, ...] = ("node", "device")  # of the exported series (catalogue)
    optional_labels: tuple[str, ...] = ("port",)
    # evaluate's fast paths: the inputs when every slot has one name (most signals), else (); and the
    # one input without which there is no value (all but the totals), checked before computing.
    names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    lead: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        single = all(len(slot) == 1 for slot in self.inputs)
        object.__setattr__(self, "names", tuple(slot[0] for slot in self.inputs) if single else ())
        needs_first = self.compute is not total and len(self.inputs[0]) == 1
        object.__setattr__(self, "lead", self.inputs[0][0] if needs_first else "")


def _one(*names: str) -> tuple[Slot, ...]:
    return tuple((n,) for n in names)


def _port(*args: Any, **kw: Any) -> Signal:
    """A signal of one HCA port (series labelled node, device, port)."""
    return Signal(*args, **{"labels": _PORT, "optional_labels": (), **kw})


def _sum(name: str, help: str, inputs: tuple[str, ...], **kw: Any) -> Signal:
    """A per-second total of counters (errors, discards, events): the inputs that have a rate.

    Not exported by the agent: Prometheus has every input's rate already (the ``_per_second`` gauge
    of the same neutral counter), and rules/prometheus adds them up the same way (a test keeps its
    lists equal to these); four more series per port would cost every scrape (docs/counters.md)."""
    formula = " + ".join(f"rate({n})" for n in inputs if n != "port_down")
    return Signal(name, "per_second", help, formula, _one(*inputs), total, **{"agent": False, **kw})


_PORT = ("node", "device", "port")
_PRIO = ("node", "device", "priority")
_QDISC = ("port", "qdisc", "handle", "parent")
SIGNALS: tuple[Signal, ...] = (
    _port(
        "ecn_marked_ratio",
        "ratio",
        "Fraction of received RoCE packets marked ECN CE (from 1,000 received packets/s)",
        "rate(rx_ecn_marked_roce_packets) / rate(received packets), received >= 1000/s",
        (("rx_ecn_marked_roce_packets",), RECEIVED_PACKETS),
        ecn_marked_ratio,
    ),
    _port(
        "cnp_sent_packets_per_second",
        "packets_per_second",
        "CNPs sent as notification point (this port receives marked traffic: a congested receiver)",
        "rate(tx_cnp_packets)",
        _one("tx_cnp_packets"),
        value,
    ),
    _port(
        "cnp_handled_packets_per_second",
        "packets_per_second",
        "CNPs handled as reaction point (this port's flows are slowed down: a throttled sender)",
        "rate(rx_cnp_packets)",
        _one("rx_cnp_packets"),
        value,
    ),
    _port(
        "xmit_wait_lost_bytes_per_second",
        "bytes_per_second",
        "Bandwidth lost to credit starvation (XmitWait rate x 8 bytes per tick, an estimate)",
        "rate(port_transmit_wait) x 8",
        _one("port_transmit_wait"),
        xmit_wait_lost_bytes_per_second,
        central=False,
    ),
    _port(
        "xmit_wait_ratio",
        "ratio",
        "Bandwidth lost to XmitWait as a fraction of the link rate",
        "rate(port_transmit_wait) x 8 / link_rate",
        _one("port_transmit_wait", "link_rate"),
        xmit_wait_ratio,
    ),
    _port(
        "symbol_errors_per_gigabyte",
        "errors_per_gigabyte",
        "Symbol errors per 1e9 received bytes",
        "rate(symbol_errors) / (rate(received bytes) / 1e9)",
        (("symbol_errors",), RECEIVED_BYTES),
        per_gigabyte,
        central=False,
    ),
    _port(
        "receive_errors_per_gigabyte",
        "errors_per_gigabyte",
        "Receive errors per 1e9 received bytes",
        "rate(port_receive_errors) / (rate(received bytes) / 1e9)",
        (("port_receive_errors",), RECEIVED_BYTES),
        per_gigabyte,
        central=False,
    ),
    Signal(
        "rx_pause_ratio",
        "ratio",
        "Fraction of the interval the priority was paused by the link partner",
        "rate(rx_pause_duration) (seconds paused per second), per priority",
        _one("rx_pause_duration"),
        ratio01,
        labels=_PRIO,
    ),
    Signal(
        "tx_pause_ratio",
        "ratio",
        "Fraction of the interval this port paused its link partner",
        "rate(tx_pause_duration) (seconds paused per second), per priority",
        _one("tx_pause_duration"),
        ratio01,
        labels=_PRIO,
    ),
    _sum("pause_storm_events_per_second", "PFC storm prevention events per second (warnings and errors)", PAUSE_STORMS),
    _sum("phy_errors_per_second", "Symbol, CRC and receive errors per second", PHY_ERRORS),
    _sum(
        "discards_per_second",
        "Discarded packets per second (port, NIC, RDMA and qdisc drops)",
        DISCARDS,
        optional_labels=_QDISC,
    ),
    _sum(
        "sequence_errors_per_second",
        "Transport sequence errors per second (packets lost in flight)",
        SEQ_ERRORS,
        labels=_PORT,
        optional_labels=(),
    ),
    _sum(
        "retransmits_per_second",
        "RoCE retransmissions and ACK timeouts per second",
        RETRANSMITS,
        labels=_PORT,
        optional_labels=(),
    ),
    _sum(
        "link_downs_per_second",
        "Link down events per second (link_downed, PHY link downs, carrier changes; port_down: the port "
        "was seen not ACTIVE or changing state)",
        LINK_DOWNS,
    ),
    Signal(
        "qdisc_backlog_bytes",
        "bytes",
        "Bytes queued in a qdisc",
        "qdisc_backlog_bytes (gauge), per qdisc",
        _one("qdisc_backlog_bytes"),
        value,
        agent=False,  # already exported as fabricd_netlink_qdisc_backlog_bytes
    ),
    Signal(
        "qdisc_overlimits_per_second",
        "per_second",
        "Qdisc overlimit events per second (shaper throttling)",
        "rate(qdisc_overlimits), per qdisc",
        _one("qdisc_overlimits"),
        value,
        agent=False,  # already exported as fabricd_netlink_qdisc_overlimits_per_second
    ),
    Signal(
        "probe_loss_ratio",
        "ratio",
        "Fraction of pingmesh probes never answered, per node pair",
        "(rate(probes_lost) - rate(probes_late)) / rate(probes_sent)",
        _one("probes_sent", "probes_lost", "probes_late"),
        loss_ratio,
        agent=False,  # Prometheus computes it over 5 minutes from the counters (rules/prometheus)
    ),
    Signal(
        "rtt_p99_outlier",
        "score",
        "Pingmesh p99 RTT, the prober's common mode removed, against the pair's robust baseline (score)",
        "(p99 - common - median) / max(1.4826 MAD, rel_floor x median, abs_floor) over the pair's history",
        _one("rtt_p99_seconds"),
        None,
        agent=False,
    ),
    Signal(
        "rtt_queue_outlier",
        "score",
        "Pingmesh minimum RTT, the prober's common mode removed, against the pair's robust baseline (score)",
        "(min - common - median) / max(1.4826 MAD, rel_floor x median, abs_floor); common = the least "
        "excess over the prober's pairs this scrape (fabricd/detect/delays.py)",
        _one("rtt_min_seconds"),
        None,
        agent=False,
    ),
    Signal(
        "nccl_time_outlier",
        "score",
        "NCCL-tests time against the fleet's robust baseline for the op and size (score)",
        "(time - fleet median) / max(1.4826 MAD, rel_floor x median)",
        _one("time_seconds"),
        None,
        agent=False,
    ),
    Signal(
        "nccl_efficiency",
        "ratio",
        "NCCL-tests busbw at the run's largest out-of-place size divided by the performance "
        "model's prediction on this node's fabric ports (device = op)",
        "busbw / perfmodel.predict(op, size, nodes, this node's active ports)",
        _one("busbw_bytes_per_second", "nodes", "ranks", "model_efficiency", "link_rate", "port_state"),
        None,
        central=False,
        labels=("node", "device", "size"),
        optional_labels=(),
    ),
    Signal(
        "nccl_efficiency_sustained",
        "ratio",
        "Best NCCL-tests efficiency of the node's last 3 runs, per op and size",
        "max(nccl_efficiency of the last 3 runs)",
        _one("nccl_efficiency"),
        None,
        agent=False,
    ),
)
BY_NAME: dict[str, Signal] = {s.name: s for s in SIGNALS}
AGENT: tuple[Signal, ...] = tuple(s for s in SIGNALS if s.agent and s.compute is not None)
CENTRAL: tuple[Signal, ...] = tuple(s for s in SIGNALS if s.central and s.compute is not None)

# What each collector's readings contribute: the inputs its driver tables can name (so a new driver
# table feeds the signals with no change here). netlink's interface statistics repeat what ethtool
# reads from the same NIC (rx_crc_errors): only its qdiscs and carrier count.
_ALL_INPUTS = frozenset(n for s in SIGNALS if s.compute is not None for slot in s.inputs for n in slot)
_IB_NAMES = {c.name for c in (*pma.COUNTERS.values(), *pma.EXT.values())} | {t.name for t in PORT_ATTRIBUTES}
_IB_NAMES |= {c.name for d in ib.drivers() for c in d.counters}
SOURCE_INPUTS: dict[str, frozenset[str]] = {
    IB: (_ALL_INPUTS & _IB_NAMES) | {"port_down", "port_state", *SENT_BYTES},
    ETHTOOL: _ALL_INPUTS & {r.name for d in eth.drivers() for r in d.rules},
    NETLINK: frozenset({"qdisc_backlog_bytes", "qdisc_overlimits", "qdisc_drops", "carrier_changes"}),
    PINGMESH: frozenset({"probes_sent", "probes_lost", "probes_late", "rtt_min_seconds", "rtt_p99_seconds"}),
    NCCL: frozenset({"time_seconds"}),
    DERIVED: frozenset({"nccl_efficiency"}),
}


def _for_source(source: str, signals: Sequence[Signal]) -> tuple[Signal, ...]:
    inputs = SOURCE_INPUTS[source]
    return tuple(s for s in signals if any(n in inputs for slot in s.inputs for n in slot))


# The signals each source's scopes can give (the others would only find their inputs missing).
AGENT_BY_SOURCE: dict[str, tuple[Signal, ...]] = {src: _for_source(src, AGENT) for src in SOURCE_INPUTS}
CENTRAL_BY_SOURCE: dict[str, tuple[Signal, ...]] = {src: _for_source(src, CENTRAL) for src in SOURCE_INPUTS}


def rate_families(signal: Signal) -> list[str]:
    """The Prometheus families of a total's inputs: each input's ``_per_second`` gauge from every
    source that reads it (what rules/prometheus and the dashboards sum for the totals)."""
    from fabricd.drivers.vocabulary import VOCABULARY
    from fabricd.naming import metric_stem

    names = [n for slot in signal.inputs for n in slot if n in VOCABULARY or n in SOURCE_INPUTS[NETLINK]]
    units = {n: VOCABULARY[n].unit if n in VOCABULARY else "" for n in names}
    return [
        metric_stem(src, n, units[n]) + "_per_second"
        for src, inputs in SOURCE_INPUTS.items()
        for n in names
        if n in inputs
    ]


def evaluate(values: Values, signals: Sequence[Signal]) -> list[tuple[Signal, float]]:
    """The signals one scope's inputs allow, in table order (every scrape, every scope: kept lean)."""
    out = []
    get = values.get
    for s in signals:
        if s.lead and s.lead not in values:
            continue
        names = s.names
        args = [get(n) for n in names] if names else [first(values, slot) for slot in s.inputs]
        got = s.compute(args)  # type: ignore[misc]  # the table's signals with a compute only
        if got is not None:
            out.append((s, got))
    return out
