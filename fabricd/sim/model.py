"""The traffic model: per interval, flows and faults become counter increments, probe results and
NCCL-tests timings. Deterministic from the scenario's seed (each interval draws from its own RNG, so
the result does not depend on who asks first).

``Simulation.advance(t)`` moves the cluster from its current time to ``t`` (scenario seconds since
the start); the writers then show the new counter values, the probe model answers for the interval
and the NCCL model for runs started at ``t``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from fabricd.signal_math import XMIT_WAIT_BYTES_PER_TICK
from fabricd.sim import faults as faults_mod
from fabricd.sim.fabric import MTU_BYTES, Fabric, Flow, ProbePair, build, stable_hash
from fabricd.sim.hca import PFC_PRIORITY, HcaPortState, new_port
from fabricd.sim.scenario import Scenario

P = PFC_PRIORITY
# XmitWait: one tick per 8 bytes the port could have sent (DOMAIN.md: lost bytes ~ ticks x 8, the
# reading fabricd.signal_math uses), so the "lost bandwidth" a detector derives is what the model
# lost. At that scale the 32-bit, saturating counter fills within seconds of heavy stalling, as real
# ones do (node_exporter's fixture holds 4294967295): after that it says "unknown", never a rate.
PAUSE_FRAME_SECONDS = 40e-6  # a paused link is refreshed about every half quanta period at 400G
CNP_PER_MARKED = 0.5  # CNPs are rate-limited per QP (mlx5 min_time_between_cnps), fewer than marks
RDMA_WRITE_BYTES = 65536  # bytes per RDMA write request (rx_write_requests), NCCL's chunking order
BASE_RTT_SECONDS = 6e-6
HOP_RTT_SECONDS = 1.5e-6
QUEUE_RTT_SECONDS = 400e-6  # added queueing delay on a fully congested path
PAUSE_RTT_SECONDS = 600e-6
STANDING_QUEUE_SHARE = 0.5  # of the mean queueing delay, what stays queued for a whole scrape
PROBE_LOG_STEPS = 16


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One pair's probes over one interval."""

    sent: int
    lost: int
    rtt: tuple[float, float, float, float, float] | None  # min, p50, p90, p99, max (seconds)


@dataclass
class PortFlow:
    """Per-port sums for one interval (bytes and events, not rates)."""

    tx: float = 0.0
    rx: float = 0.0
    marked: float = 0.0
    cnp_handled: float = 0.0
    lost_rx: float = 0.0
    lost_tx: float = 0.0
    timeouts: float = 0.0
    xmit_wait: float = 0.0


@dataclass
class Simulation:
    scenario: Scenario
    fabric: Fabric
    ports: dict[str, HcaPortState]
    now: float = 0.0
    step_index: int = 0
    probe_totals: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    probe_last: dict[tuple[str, str], ProbeResult] = field(default_factory=dict)
    # the last steps' results per pair, for a prober that reads once per scrape (several steps)
    probe_log: dict[tuple[str, str], list[tuple[int, ProbeResult]]] = field(default_factory=dict)
    last: faults_mod.Conditions = field(default_factory=faults_mod.Conditions)

    @property
    def roce(self) -> bool:
        return self.scenario.topology.link_layer == "roce"

    def advance(self, t: float) -> None:
        """Move to scenario time ``t`` (> now): counters, link states and probe results change."""
        if t <= self.now:
            return
        t0, self.now = self.now, t
        self.step_index += 1
        rng = random.Random(stable_hash(str(self.scenario.seed), "step", f"{t0:.3f}"))
        cond = faults_mod.conditions(self.fabric, t0, t)
        self.last = cond
        sums = self._traffic(cond, t - t0, rng)
        for port_id, state in self.ports.items():
            _apply(state, sums.get(port_id, PortFlow()), cond, t - t0, rng, self.fabric.line_bytes_per_second)
        self._probes(cond, t - t0, rng)

    # --- traffic ---------------------------------------------------------------------------------

    def _traffic(self, cond: faults_mod.Conditions, dt: float, rng: random.Random) -> dict[str, PortFlow]:
        sums: dict[str, PortFlow] = {}
        load = self.scenario.workload.load
        noise = self.scenario.workload.noise
        line = self.fabric.line_bytes_per_second
        demands = []
        for flow in self.fabric.flows:
            jitter = max(0.0, 1.0 + rng.gauss(0.0, noise))
            demands.append(
                (flow, line * load * flow.share * jitter * _node_load(self.scenario.seed, self.fabric.key(flow.src)))
            )
        for flow, rate in _fair_shares(demands, line):
            _flow(sums, flow, rate * dt, cond, self.roce, dt, line)
        for port, sev in cond.incast.items():
            _incast(sums, self.fabric, port, sev, dt, self.roce)
        return sums

    # --- probes ----------------------------------------------------------------------------------

    def _probes(self, cond: faults_mod.Conditions, dt: float, rng: random.Random) -> None:
        rate = self.scenario.workload.probe_rate
        for pair in self.fabric.probes:
            result = probe_interval(pair, cond, dt, rate, rng, self.fabric)
            key = (pair.src, pair.dst)
            sent, lost = self.probe_totals.get(key, (0, 0))
            self.probe_totals[key] = (sent + result.sent, lost + result.lost)
            self.probe_last[key] = result
            log = self.probe_log.setdefault(key, [])
            log.append((self.step_index, result))
            if len(log) > PROBE_LOG_STEPS:
                del log[0]

    # --- NCCL ------------------------------------------------------------------------------------

    def nccl_members(self, node: str, t: float) -> list[str]:
        run = int(t // self.scenario.nccl_every)
        return [node, self.fabric.nccl_partner(node, run)]

    def nccl_factor(self, members: list[str]) -> float:
        """Bandwidth of a collective among ``members`` relative to a healthy fabric, under the current
        conditions: the slowest link of the job and the slowest node decide."""
        cond = self.last
        factor = 1.0
        for link in self.fabric.job_links(members):
            factor = min(factor, _link_factor(link, cond))
        for node in members:
            for port in self.fabric.ports_of[node]:
                factor = min(factor, 1.0 - 0.8 * cond.paused.get(port, 0.0), 1.0 - cond.storm.get(port, 0.0))
            factor /= cond.slow.get(node, 1.0)
        return max(factor, 0.01)


def _fair_shares(demands: list[tuple[Flow, float]], line: float) -> list[tuple[Flow, float]]:
    """Each flow's rate once no port sends or receives more than its line rate.

    Load skew and jitter can ask more of a port than its link carries (several flows converging
    on one receiver asked up to 1.7x line rate in ``clean-ib``); real congestion control slows
    the flows until the port is full. One proportional step does the same here: a flow gets at
    most its share of each of its two ports (demand x line / the port's total demand), so neither
    end exceeds line rate and the flows of an uncontended port keep their rate.
    """
    tx: dict[str, float] = {}
    rx: dict[str, float] = {}
    for flow, rate in demands:
        tx[flow.src] = tx.get(flow.src, 0.0) + rate
        rx[flow.dst] = rx.get(flow.dst, 0.0) + rate
    return [
        (
            flow,
            rate
            * min(
                1.0,
                line / tx[flow.src] if tx[flow.src] > line else 1.0,
                line / rx[flow.dst] if rx[flow.dst] > line else 1.0,
            ),
        )
        for flow, rate in demands
    ]


def _node_load(seed: int, port: str) -> float:
    """Per-port load skew (0.8-1.2) from the seed: some links are busier than others."""
    return 0.8 + 0.4 * (stable_hash(str(seed), "load", port) % 1000) / 1000.0


def _link_factor(link: str, cond: faults_mod.Conditions) -> float:
    factor = 1.0 - 0.4 * cond.congestion.get(link, 0.0)
    factor *= 1.0 - min(0.6, 40.0 * cond.loss.get(link, 0.0))
    return factor * (1.0 - cond.down.get(link, 0.0))


def _flow(
    sums: dict[str, PortFlow],
    flow: Flow,
    nominal: float,
    cond: faults_mod.Conditions,
    roce: bool,
    dt: float,
    line: float,
) -> None:
    factor, cong, loss, down = 1.0, 0.0, 0.0, 0.0
    for link in flow.links:
        factor *= _link_factor(link, cond)
        cong = max(cong, cond.congestion.get(link, 0.0))
        loss = 1.0 - (1.0 - loss) * (1.0 - cond.loss.get(link, 0.0))
        down = max(down, cond.down.get(link, 0.0))
    factor *= 1.0 - cond.paused.get(flow.src, 0.0)  # a paused sender cannot transmit
    factor *= 1.0 - cond.storm.get(flow.dst, 0.0)  # a storming receiver takes nothing in
    sent = nominal * factor
    src, dst = sums.setdefault(flow.src, PortFlow()), sums.setdefault(flow.dst, PortFlow())
    src.tx += sent
    dst.rx += sent
    packets = sent / MTU_BYTES
    if cong > 0:
        marked = packets * min(0.5, 0.02 + 0.18 * cong) if roce else 0.0
        dst.marked += marked
        src.cnp_handled += marked * CNP_PER_MARKED
        src.xmit_wait += line / XMIT_WAIT_BYTES_PER_TICK * dt * 0.3 * cong * flow.share
    dst.lost_rx += packets * loss
    src.lost_tx += packets * loss
    src.timeouts += 50.0 * down * dt * flow.share  # QPs time out while the link is down
    src.xmit_wait += line / XMIT_WAIT_BYTES_PER_TICK * dt * cond.paused.get(flow.src, 0.0) * flow.share


def _incast(sums: dict[str, PortFlow], fabric: Fabric, port: str, sev: float, dt: float, roce: bool) -> None:
    """Many senders converge on ``port``: its downlink runs full and marks heavily; the senders slow."""
    line = fabric.line_bytes_per_second
    dst = sums.setdefault(port, PortFlow())
    extra = max(0.0, line * dt * sev - dst.rx * 0.5)
    dst.rx = min(dst.rx + extra, line * dt)  # the downlink runs full; what does not fit waits upstream
    packets = extra / MTU_BYTES
    marked = packets * (0.1 + 0.3 * sev) if roce else 0.0
    dst.marked += marked
    senders = _incast_senders(fabric, port)
    for s in senders:
        src = sums.setdefault(s, PortFlow())
        src.tx += extra / len(senders)
        src.cnp_handled += marked * CNP_PER_MARKED / len(senders)
        src.xmit_wait += line / XMIT_WAIT_BYTES_PER_TICK * dt * 0.5 * sev


def _incast_senders(fabric: Fabric, port: str) -> list[str]:
    node = fabric.topology.hca_ports[port].node
    rail = fabric.ports_of[node].index(port)
    others = [n for n in fabric.nodes if n != node]
    step = max(1, len(others) // 8)
    return [fabric.rail_port(n, rail) for n in others[::step][:8]]


def _apply(
    s: HcaPortState, f: PortFlow, cond: faults_mod.Conditions, dt: float, rng: random.Random, line: float
) -> None:
    c, hw = s.counters, s.hw
    tx_pk, rx_pk = f.tx / MTU_BYTES, f.rx / MTU_BYTES
    c.add("port_xmit_data", f.tx / 4)  # 4-octet words (kernel ABI sysfs-class-infiniband)
    c.add("port_rcv_data", f.rx / 4)
    for name, value in (
        ("port_xmit_packets", tx_pk),
        ("unicast_xmit_packets", tx_pk),
        ("port_rcv_packets", rx_pk),
        ("unicast_rcv_packets", rx_pk),
    ):
        c.add(name, value)
    c.add("multicast_rcv_packets", 0.2 * dt)  # subnet manager / IPoIB chatter
    c.add("multicast_xmit_packets", 0.05 * dt)
    util = min(1.0, f.tx / (line * dt)) if dt > 0 else 0.0
    c.add("port_xmit_wait", f.xmit_wait + line / XMIT_WAIT_BYTES_PER_TICK * dt * 1e-5 * util**4)
    hw.add("rx_write_requests", f.rx / RDMA_WRITE_BYTES)
    hw.add("rx_read_requests", f.rx / (RDMA_WRITE_BYTES * 512))
    hw.add("rx_dct_connect", 0.05 * dt)
    _errors(s, f, cond, dt)
    _link_state(s, cond)
    if s.roce:
        _roce(s, f, cond, dt, util)
    if rng.random() < 0.0005:  # a rare, isolated bit error: healthy links see one now and then
        c.add("symbol_error", 1)


def _errors(s: HcaPortState, f: PortFlow, cond: faults_mod.Conditions, dt: float) -> None:
    hw = s.hw
    hw.add("out_of_sequence", f.lost_rx)  # responder saw a gap (RoCE/IB RC)
    hw.add("duplicate_request", f.lost_tx * 0.1)
    hw.add("packet_seq_err", f.lost_tx * 0.5)  # requester got a sequence-error NAK
    hw.add("implied_nak_seq_err", f.lost_tx * 0.1)
    hw.add("local_ack_timeout_err", f.lost_tx * 0.02 + f.timeouts)
    if s.roce:
        hw.add("roce_adp_retrans", f.lost_tx * 0.3)
        hw.add("roce_adp_retrans_to", f.timeouts * 0.5)
    sev = cond.lossy_ports.get(s.port_id, 0.0)
    if sev > 0:  # a bad cable or transceiver: the PHY sees bad symbols, the PMA bad packets
        s.counters.add("symbol_error", 5.0 * sev * dt)
        s.counters.add("port_rcv_errors", 2.0 * sev * dt)
        if s.roce:
            s.ethtool.add("rx_symbol_err_phy", 5.0 * sev * dt)
            s.ethtool.add("rx_crc_errors_phy", 2.0 * sev * dt)
            s.ethtool.add("rx_pcs_symbol_err_phy", 5.0 * sev * dt)


def _link_state(s: HcaPortState, cond: faults_mod.Conditions) -> None:
    link_id = f"{s.port_id}~"
    flaps = sum(n for link, n in cond.flaps.items() if link.startswith(link_id))
    if flaps:
        s.counters.add("link_downed", flaps)
        s.counters.add("link_error_recovery", flaps)
        if s.roce:
            s.ethtool.add("link_down_events_phy", flaps)
    s.up = not any(link.startswith(link_id) for link in cond.down_now)


def _roce(s: HcaPortState, f: PortFlow, cond: faults_mod.Conditions, dt: float, util: float) -> None:
    hw, e = s.hw, s.ethtool
    rx_pk, tx_pk = f.rx / MTU_BYTES, f.tx / MTU_BYTES
    baseline = rx_pk * 1e-5 * util**8  # DCQCN marks a little on busy healthy links
    hw.add("np_ecn_marked_roce_packets", f.marked + baseline)
    hw.add("np_cnp_sent", (f.marked + baseline) * CNP_PER_MARKED)
    hw.add("rp_cnp_handled", f.cnp_handled + baseline * CNP_PER_MARKED)
    e.add(f"rx_prio{P}_marked", f.marked + baseline)
    for name, value in (
        ("rx_vport_rdma_unicast_bytes", f.rx),
        ("tx_vport_rdma_unicast_bytes", f.tx),
        ("rx_vport_rdma_unicast_packets", rx_pk),
        ("tx_vport_rdma_unicast_packets", tx_pk),
        (f"rx_prio{P}_bytes", f.rx),
        (f"tx_prio{P}_bytes", f.tx),
        (f"rx_prio{P}_packets", rx_pk),
        (f"tx_prio{P}_packets", tx_pk),
        ("rx_bytes_phy", f.rx),
        ("tx_bytes_phy", f.tx),
        ("rx_packets_phy", rx_pk),
        ("tx_packets_phy", tx_pk),
    ):
        e.add(name, value)
    for name, value in (
        ("rx_bytes", 2e5),
        ("tx_bytes", 2e5),
        ("rx_packets", 300),
        ("tx_packets", 300),
        ("rx_prio0_bytes", 2e5),
        ("tx_prio0_bytes", 2e5),
    ):  # TCP/IP management traffic
        e.add(name, value * dt)
    _pauses(s, cond, dt)


def _pauses(s: HcaPortState, cond: faults_mod.Conditions, dt: float) -> None:
    """PFC on priority 3: durations in microseconds (PPCNT), frames, transitions, storm watchdog."""
    e = s.ethtool
    paused = cond.paused.get(s.port_id, 0.0)
    if paused > 0:
        e.add(f"rx_prio{P}_pause", paused * dt / PAUSE_FRAME_SECONDS)
        e.add(f"rx_prio{P}_pause_duration", paused * dt * 1e6)
        e.add(f"rx_prio{P}_pause_transition", 20.0 * paused * dt)
        e.add("rx_pause_ctrl_phy", paused * dt / PAUSE_FRAME_SECONDS)
    storm = cond.storm.get(s.port_id, 0.0)
    if storm > 0:
        e.add(f"tx_prio{P}_pause", storm * dt / PAUSE_FRAME_SECONDS)
        e.add(f"tx_prio{P}_pause_duration", storm * dt * 1e6)
        e.add("tx_pause_ctrl_phy", storm * dt / PAUSE_FRAME_SECONDS)
        e.add("tx_pause_storm_warning_events", storm * dt / 10.0)  # the stall watchdog fires repeatedly
        e.add("tx_pause_storm_error_events", max(0.0, storm - 0.94) * dt)  # prevention engages when severe


def probe_interval(
    pair: ProbePair, cond: faults_mod.Conditions, dt: float, rate: float, rng: random.Random, fabric: Fabric
) -> ProbeResult:
    """Probes of one pair over ``dt`` seconds: how many were sent and lost, and their RTTs."""
    sent = max(1, round(rate * dt))
    queue, loss, down = 0.0, 0.0, 0.0
    for link in pair.links:
        queue += QUEUE_RTT_SECONDS * cond.congestion.get(link, 0.0)
        loss = 1.0 - (1.0 - loss) * (1.0 - cond.loss.get(link, 0.0))
        down = max(down, cond.down.get(link, 0.0))
    for node in (pair.src, pair.dst):
        port = fabric.rail_port(node, pair.rail)
        queue += PAUSE_RTT_SECONDS * max(cond.paused.get(port, 0.0), cond.storm.get(port, 0.0))
    p_lost = 1.0 - (1.0 - loss) * (1.0 - down)
    lost = _binomial(sent, p_lost, rng)
    if lost >= sent:
        return ProbeResult(sent, sent, None)
    base = BASE_RTT_SECONDS + HOP_RTT_SECONDS * len(pair.links)
    p50 = (base + queue) * math.exp(rng.gauss(0.0, 0.05))
    tail = 1.4 + (1.5 if queue > 0 else 0.0)
    # A congested queue under DCQCN/ECN oscillates but rarely drains within a scrape: part of it
    # stands, and even the fastest probe waits behind it (the minimum moves, host jitter does not).
    low = base * 0.9 + STANDING_QUEUE_SHARE * queue
    rtt = (low, max(low, p50), p50 * (1 + (tail - 1) * 0.5), p50 * tail, p50 * tail * 1.3)
    return ProbeResult(sent, lost, rtt)


def _binomial(n: int, p: float, rng: random.Random) -> int:
    if p <= 0:
        return 0
    if p >= 1:
        return n
    if n * p > 30:  # normal approximation, clamped
        return max(0, min(n, round(rng.gauss(n * p, math.sqrt(n * p * (1 - p))))))
    return sum(1 for _ in range(n) if rng.random() < p)


def simulate(scenario: Scenario) -> Simulation:
    """A cluster at scenario time 0 with the history ``new_port`` gives each port."""
    fabric = build(scenario)
    rng = random.Random(scenario.seed)
    roce = scenario.topology.link_layer == "roce"
    ports = {p: new_port(p, roce, random.Random(rng.random())) for p in fabric.ports}
    return Simulation(scenario, fabric, ports)
