"""Crafted sample series for the detectors: what the agent would ship, built from rates.

Used by the detector unit tests (a test harness, so it ships in no package) and handy for
replaying a what-if by hand. Values are rates as ``fabricd.counters`` would compute them (per
second, base units); ``status`` other than OK carries no rate, exactly like the real pipeline (a
saturated counter has ``rate=None``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fabricd.drivers import ib
from fabricd.drivers.ib import pma
from fabricd.model import Incident, Kind, Reading, Sample, Status, labels_of

LINK_BYTES_PER_SECOND = 400 * 125_000_000.0  # 400 Gb/s
Overrides = Callable[[float, str, str], Mapping[str, float | None]]  # (ts, node, hca) -> metric -> rate


def counter(
    ts: float,
    source: str,
    device: str,
    metric: str,
    rate: float | None,
    *,
    port: str = "",
    unit: str = "",
    labels: Mapping[str, str] | None = None,
    name: str = "",
    status: Status = Status.OK,
) -> Sample:
    r = Reading(source, device, port, metric, 0.0, unit, Kind.COUNTER, labels_of(labels), name)
    if rate is None and status is Status.OK:
        status = Status.SATURATED
    return Sample(ts, r, rate, status, ts if status is Status.SATURATED else None)


def gauge(
    ts: float,
    source: str,
    device: str,
    metric: str,
    value: float,
    *,
    port: str = "",
    labels: Mapping[str, str] | None = None,
    name: str = "",
) -> Sample:
    return Sample(ts, Reading(source, device, port, metric, value, "", Kind.GAUGE, labels_of(labels), name, 0), None)


def ib_port(
    ts: float,
    device: str,
    rates: Mapping[str, float | None],
    *,
    link_rate: float = LINK_BYTES_PER_SECOND,
    state: float = 4.0,
) -> list[Sample]:
    """One InfiniBand/RoCE HCA port scrape: counters/ and hw_counters/ rates (mlx5 file names, read
    with their neutral names as the collector does), state and rate gauges."""
    out = [counter(ts, "infiniband", device, m, v, port="1", name=mlx5_name(m)) for m, v in rates.items()]
    out.append(gauge(ts, "infiniband", device, "rate", link_rate, port="1", name="link_rate"))
    out.append(gauge(ts, "infiniband", device, "state", state, port="1", name="port_state"))
    return out


def mlx5_name(raw: str) -> str:
    """The neutral name the infiniband collector gives an mlx5 counters/ or hw_counters/ file."""
    row = pma.COUNTERS.get(raw) or ib.hw_counter("mlx5", raw)
    return row.name if row is not None and row.name else raw


def healthy_rates(utilization: float = 0.6) -> dict[str, float | None]:
    """A busy, healthy RoCE port: traffic, a trickle of ECN marks and CNPs, nothing lost."""
    data = utilization * LINK_BYTES_PER_SECOND
    pps = data / 4096
    return {
        "port_xmit_data": data,
        "port_rcv_data": data,
        "port_xmit_packets": pps,
        "port_rcv_packets": pps,
        "np_ecn_marked_roce_packets": pps * 0.001,
        "np_cnp_sent": 50.0,
        "rp_cnp_handled": 50.0,
        "port_xmit_wait": 0.005 * LINK_BYTES_PER_SECOND / 8,
        "symbol_error": 0.0,
        "port_rcv_errors": 0.0,
        "link_downed": 0.0,
        "port_xmit_discards": 0.0,
        "out_of_sequence": 0.0,
        "packet_seq_err": 0.0,
        "roce_adp_retrans": 0.0,
        "local_ack_timeout_err": 0.0,
    }


def pause(ts: float, ifname: str, direction: str, fraction: float, priority: str = "3") -> Sample:
    """rx/tx pause duration rate (seconds paused per second) as the ethtool collector names it."""
    raw = f"{direction}_prio{priority}_pause_duration"
    return counter(
        ts,
        "ethtool",
        ifname,
        raw,
        fraction,
        unit="seconds",
        labels={"priority": priority},
        name=f"{direction}_pause_duration",
    )


def probes(ts: float, peer: str, sent: float, lost: float, p99: float | None) -> list[Sample]:
    out = [counter(ts, "pingmesh", peer, "probes_sent", sent), counter(ts, "pingmesh", peer, "probes_lost", lost)]
    if p99 is not None:
        # the synthetic pairs' delay is a standing queue: it moves the fastest probe as the slowest
        out.append(gauge(ts, "pingmesh", peer, "rtt_min", p99, name="rtt_min_seconds"))
        out.append(gauge(ts, "pingmesh", peer, "rtt_p99", p99, name="rtt_p99_seconds"))
    return out


def nccl_time(ts: float, op: str, size: int, seconds: float) -> Sample:
    labels = {"size": str(size), "placement": "out_of_place"}
    return gauge(ts, "nccl", op, "time", seconds, labels=labels, name="time_seconds")


def nccl_run(ts: float, seconds: float, hosts: Iterable[str]) -> list[Sample]:
    """One NCCL-tests all_reduce run as the nccl collector reports it: its time and its hosts."""
    info = [
        Sample(
            ts,
            Reading(
                "nccl", "all_reduce", "", "run_host", 1.0, "", Kind.INFO, labels_of({"host": h}), "run_host_info", 0
            ),
            None,
        )
        for h in sorted(set(hosts))
    ]
    return [nccl_time(ts, "all_reduce", 8 << 20, seconds), *info]


@dataclass
class Cluster:
    """A fleet of nodes scraped every ``interval``: healthy by default, with per-port overrides."""

    nodes: list[str]
    hcas: int = 2
    interval: float = 10.0
    start: float = 1_700_000_000.0
    probe_peers: Mapping[str, list[str]] = field(default_factory=dict)
    nccl: bool = False

    def rounds(
        self,
        count: int,
        port: Overrides | None = None,
        pairs: Callable[[float, str, str], tuple[float, float]] | None = None,
        nccl: Callable[[float, str], float] | None = None,
        extra: Callable[[float, str], list[Sample]] | None = None,
    ) -> Iterator[list[tuple[str, Sample]]]:
        """``count`` scrape rounds; ``pairs`` -> (loss fraction, p99 s), ``nccl`` -> time (s)."""
        for i in range(count):
            ts = self.start + i * self.interval
            batch: list[tuple[str, Sample]] = []
            for node in self.nodes:
                for h in range(self.hcas):
                    rates = healthy_rates()
                    if port is not None:
                        rates.update(port(ts, node, f"mlx5_{h}"))
                    batch.extend((node, s) for s in ib_port(ts, f"mlx5_{h}", rates))
                for peer in self.probe_peers.get(node, []):
                    loss, p99 = pairs(ts, node, peer) if pairs is not None else (0.0, 20e-6)
                    batch.extend((node, s) for s in probes(ts, peer, 10.0, 10.0 * loss, p99))
                if self.nccl:
                    t = nccl(ts, node) if nccl is not None else 0.010
                    batch.append((node, nccl_time(ts, "all_reduce", 8 << 20, t)))
                if extra is not None:
                    batch.extend((node, s) for s in extra(ts, node))
            yield batch


def replay(engine: Any, batches: Iterable[list[tuple[str, Sample]]]) -> list[Incident]:
    """Feed every batch; returns each change the engine reported (copies, in order)."""
    out: list[Incident] = []
    for batch in batches:
        out.extend(copy.deepcopy(engine.process(batch)))
    return out


def spine_of(src: int, dst: int, spines: int) -> int:
    """A deterministic ECMP choice for tests (1-based spine number from the nodes' 1-based numbers),
    like a switch's hash."""
    return (src + dst) % spines + 1


def path_oracle(topology: Any, spines: int) -> Callable[[str, str], list[str]]:
    """The links a probe between two nodes crosses under ``spine_of`` (rail mlx5_0). Nodes and spines
    are numbered in the order the topology lists them, so any names work (``node-007`` is node 7)."""
    number = {node: i for i, node in enumerate(topology.nodes, 1)}
    spine_ids = [s.id for s in topology.switches.values() if s.tier == "spine"]
    assert len(spine_ids) == spines, f"the topology has {len(spine_ids)} spines, not {spines}"

    def path(src: str, dst: str) -> list[str]:
        a, b = f"{src}/mlx5_0", f"{dst}/mlx5_0"
        up, down = topology.uplink(a), topology.uplink(b)
        if up.b == down.b:
            return [up.id, down.id]
        spine = spine_ids[spine_of(number[src], number[dst], spines) - 1]
        return [up.id, f"{up.b}~{spine}", f"{down.b}~{spine}", down.id]

    return path
