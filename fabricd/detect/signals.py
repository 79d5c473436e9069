"""From samples to detector signals: one scrape of one device at a time, in event time.

Samples of one (node, source, device) that share a scrape (timestamps within ``tolerance``) are
gathered in a ``Record``, keyed by their neutral names whatever the source or driver; when the
scrape is complete the record is split into scopes (``fabricd.signal_math.scopes``: a port, a
priority, a qdisc, a probed peer) and every detector signal of the table is computed by its one
function (``rules/detection/*.yaml`` name them; ``docs/detection.md`` lists them). A rate of
``None`` (first sighting, reset, saturated counter: ``fabricd.counters``) contributes nothing: a
saturated counter can never raise an incident, it only stops informing one.

What this module adds to the table is the context only the central has, kept per port between
scrapes: the link rate (``xmit_wait_ratio`` when a scrape lacks the rate file), the port state
(``port_down``: seen not ACTIVE, or toggled, feeds ``link_downs_per_second`` even when
``link_downed`` is saturated at 255) and the utilization (evidence that tells "busy" from
"congested"). The stateful signals (``rtt_p99_outlier``, ``nccl_time_outlier``: robust baselines in
the engine; ``nccl_efficiency_sustained``: the best of the last runs) get their inputs from here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from fabricd import signal_table as table
from fabricd.detect.responders import REPORTS
from fabricd.model import Labels
from fabricd.signal_math import ScopeKey, first, join_device_level

IB, ETHTOOL, NETLINK, PINGMESH, NCCL = table.IB, table.ETHTOOL, table.NETLINK, table.PINGMESH, table.NCCL
DERIVED = table.DERIVED  # signals the agent computed (fabricd.derived); only nccl_efficiency is read here
SOURCES = frozenset(table.SOURCE_INPUTS)
IB_PORT_ACTIVE = 4.0  # sysfs ``state``: "4: ACTIVE"
# Runs an efficiency drop must last: a healthy node paired once with a slow one is low for one run
# (jobs rotate their members), a straggler is low in every run it joins.
EFFICIENCY_RUNS = 3

# The signals rules may name, with their help text (the table's detector signals).
SIGNALS: dict[str, str] = {s.name: s.help for s in table.SIGNALS if s.central}
# The neutral names each source handler reads (the signals' inputs, and the pingmesh responder's
# start and the requests it missed: fabricd.detect.responders); everything else is skipped first.
WANTED: dict[str, frozenset[str]] = {
    **table.SOURCE_INPUTS,
    PINGMESH: table.SOURCE_INPUTS[PINGMESH] | set(REPORTS),
}

PASSED = tuple((name, name) for name in REPORTS)

Emit = Callable[[str, str, str, str, Labels, float, float], None]  # signal, node, dev, port, labels, ts, v


@dataclass(slots=True)
class Record:
    """One scrape of one (node, source, device): its inputs in scopes, ``(port, labels) -> metric ->
    value`` (counters: their rate; one without an honest rate is left out), the grouping of
    ``fabricd.signal_math.scopes``, filled as the samples arrive."""

    node: str
    source: str
    device: str
    ts: float
    scopes: dict[ScopeKey, dict[str, float]] = field(default_factory=dict)
    dirty: bool = False


@dataclass(slots=True)
class PortContext:
    """What persists between scrapes for one port: link rate, IB state, last utilization."""

    link_rate: float | None = None
    state: float | None = None
    utilization: float | None = None
    rx_utilization: float | None = None


class Extractor:
    """Turns completed records into signals through ``emit``; keeps per-port context."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.ports: dict[tuple[str, str, str], PortContext] = {}
        self.efficiency: dict[tuple[str, str, Labels], deque[float]] = {}  # (node, op, size) -> last runs

    def flush(self, rec: Record) -> None:
        signals = table.CENTRAL_BY_SOURCE.get(rec.source, ())
        stateful = _STATEFUL.get(rec.source)
        for (port, labels), values in join_device_level(rec.scopes).items():
            if rec.source == IB:
                self._ib_context(rec, port, values)
            for signal, value in table.evaluate(values, signals):
                self.emit(signal.name, rec.node, rec.device, port, labels, rec.ts, value)
            if stateful is not None:
                stateful(self, rec, labels, values)
        rec.scopes = {}
        rec.dirty = False

    def context(self, node: str, device: str, port: str) -> PortContext:
        key = (node, device, port)
        ctx = self.ports.get(key)
        if ctx is None:
            ctx = self.ports[key] = PortContext()
        return ctx

    def _ib_context(self, rec: Record, port: str, values: dict[str, float]) -> None:
        """Update the port's context and put what it knows into the scope's inputs."""
        ctx = self.context(rec.node, rec.device, port)
        if values.get("link_rate"):
            ctx.link_rate = values["link_rate"]
        elif ctx.link_rate:
            values["link_rate"] = ctx.link_rate
        if ctx.link_rate:
            tx, rx = first(values, table.SENT_BYTES), first(values, table.RECEIVED_BYTES)
            ctx.utilization = None if tx is None else tx / ctx.link_rate
            ctx.rx_utilization = None if rx is None else rx / ctx.link_rate
        state = values.get("port_state")
        if state is not None:
            toggled = ctx.state is not None and (state == IB_PORT_ACTIVE) != (ctx.state == IB_PORT_ACTIVE)
            ctx.state = state
            # A port seen down, or seen changing state, is a flap even when link_downed is
            # saturated (8 bits: it stops at 255) or the toggle fell between two scrapes.
            if toggled or state != IB_PORT_ACTIVE:
                values["port_down"] = 1.0

    # --- inputs of the stateful signals --------------------------------------------------------

    def pingmesh(self, rec: Record, labels: Labels, values: dict[str, float]) -> None:
        # scored by the engine against the pair's baseline, the prober's common mode removed
        # (fabricd.detect.delays: rtt_queue_outlier, rtt_p99_outlier)
        # and what the peer says of its responder (its start, the requests it missed), by which the
        # engine tells unanswerable probes from lost
        for name, signal in (("rtt_min_seconds", "rtt_min"), ("rtt_p99_seconds", "rtt_p99"), *PASSED):
            v = values.get(name)
            if v is not None:
                self.emit(signal, rec.node, rec.device, "", labels, rec.ts, v)

    def nccl(self, rec: Record, labels: Labels, values: dict[str, float]) -> None:
        t = values.get("time_seconds")
        if t is not None:  # scored against the fleet by the engine (nccl_time_outlier)
            self.emit("nccl_time", rec.node, rec.device, "", labels, rec.ts, t)

    def derived(self, rec: Record, labels: Labels, values: dict[str, float]) -> None:
        v = values.get("nccl_efficiency")
        if v is None:
            return
        key = (rec.node, rec.device, labels)
        runs = self.efficiency.get(key)
        if runs is None:
            runs = self.efficiency[key] = deque(maxlen=EFFICIENCY_RUNS)
        runs.append(v)
        if len(runs) == EFFICIENCY_RUNS:  # the best of the last runs: low only if all of them were
            self.emit("nccl_efficiency_sustained", rec.node, rec.device, "", labels, rec.ts, max(runs))


_STATEFUL: dict[str, Callable[[Extractor, Record, Labels, dict[str, float]], None]] = {
    PINGMESH: Extractor.pingmesh,
    NCCL: Extractor.nccl,
    DERIVED: Extractor.derived,
}
