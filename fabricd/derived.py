"""Derived signals computed from one scrape's samples (``source="derived"``, gauges, unit in the name).

Only inputs with an honest rate (status OK or WRAPPED) are used: a first sighting, a reset or a
saturated counter yields no derived value rather than a wrong one. Assumptions and sources are in
``docs/counters.md`` ("Derived signals"); the NCCL-tests efficiency (gauges in, a model prediction
against the node's own ports) in ``docs/model.md`` ("Efficiency at the agent").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from fabricd.model import Kind, Labels, Reading, Sample, Status
from fabricd.perfmodel import ALGOS, OPS, Fabric, efficiency, predict

SOURCE = "derived"
IB = "infiniband"
NCCL = "nccl"
IB_PORT_ACTIVE = 4.0  # sysfs ``state``: "4: ACTIVE"
_HONEST = frozenset({Status.OK, Status.WRAPPED})
# DOMAIN.md: on Quantum switches lost bytes ~ delta(port_xmit_wait) x 8.
XMIT_WAIT_BYTES_PER_TICK = 8.0
GIGABYTE = 1e9
# Congestion notification packets, per second: (hw_counters name, derived name).
CNP_COUNTERS: tuple[tuple[str, str], ...] = (
    ("np_cnp_sent", "cnp_sent_packets_per_second"),
    ("rp_cnp_handled", "cnp_handled_packets_per_second"),
)
ERRORS_PER_GB: tuple[tuple[str, str], ...] = (
    ("symbol_error", "symbol_errors_per_gigabyte"),
    ("port_rcv_errors", "receive_errors_per_gigabyte"),
)
PAUSE_DURATIONS: dict[str, str] = {
    "rx_pause_duration": "rx_pause_ratio",
    "tx_pause_duration": "tx_pause_ratio",
}

Index = Mapping[tuple[str, str, str], Sample]  # (device, port, counter) -> infiniband sample


# The infiniband counters the signals below read: derive() indexes only these.
IB_INPUTS = frozenset(
    {
        "np_ecn_marked_roce_packets",
        "port_rcv_packets",
        "port_xmit_wait",
        "port_rcv_data",
        *(raw for raw, _ in CNP_COUNTERS),
        *(raw for raw, _ in ERRORS_PER_GB),
    }
)


# Gauges and infos the NCCL efficiency reads (no rate): the NCCL run, the node's fabric ports.
MODEL_INPUTS = frozenset({"busbw", "nodes", "ranks", "model_efficiency", "rate", "state", "port_info"})


_WANTED = IB_INPUTS | MODEL_INPUTS


def derive(samples: Sequence[Sample]) -> list[Sample]:
    """Every derived signal the inputs allow."""
    model: list[Sample] = []
    ib, paused = index_inputs(samples, model)
    out: list[Sample] = []
    out.extend(ecn_marked_ratio(ib))
    out.extend(cnp_rates(ib))
    out.extend(xmit_wait_lost_bandwidth(ib))
    out.extend(errors_per_gigabyte(ib))
    out.extend(pause_ratios(paused))
    if model:
        out.extend(nccl_efficiency(model))
    return out


def index_inputs(
    samples: Sequence[Sample], model: list[Sample] | None = None
) -> tuple[dict[tuple[str, str, str], Sample], list[Sample]]:
    """One pass over a scrape: the honest infiniband inputs by (device, port, counter) (a repeated
    key keeps its first position and its last sample, as a dict does) and the honest pause durations.
    When ``model`` is given, the rate-less samples named in ``MODEL_INPUTS`` are appended to it.

    Runs on every scrape over every sample, so most samples cost a few set lookups of interned
    names; only the candidates have their rate and status checked (by identity: an enum's hash is
    a Python call).
    """
    ib: dict[tuple[str, str, str], Sample] = {}
    paused: list[Sample] = []
    for s in samples:
        r = s.reading
        counter = r.counter
        if counter not in _WANTED and r.name not in PAUSE_DURATIONS:
            continue
        wanted_ib = counter in IB_INPUTS and r.source == IB
        if s.rate is None or not _honest(s.status):
            if model is not None and counter in MODEL_INPUTS:
                model.append(s)
            continue
        if wanted_ib:
            ib[(r.device, r.port, counter)] = s
        if r.name in PAUSE_DURATIONS:
            paused.append(s)
    return ib, paused


def _honest(status: Status) -> bool:
    return status is Status.OK or status is Status.WRAPPED


def _derived(src: Sample, port: str, name: str, value: float, unit: str, labels: Labels = ()) -> Sample:
    r = src.reading
    return Sample(src.ts, Reading(SOURCE, r.device, port, name, value, unit, Kind.GAUGE, labels, name, 0))


def _rate(s: Sample) -> float:
    assert s.rate is not None  # derive() keeps only samples with a rate
    return s.rate


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


def ecn_marked_ratio(ib: Index) -> Iterator[Sample]:
    """delta(np_ecn_marked_roce_packets) / delta(port_rcv_packets), per device and port.

    Both are read within one scrape, so the ratio of rates is the ratio of deltas. hw_counters are
    cached by the driver (``lifespan``, ~10 ms) so the two deltas cover slightly different
    windows: the ratio is clamped to [0, 1]. A device-level ECN counter (port "") is matched to the
    device's only port; with several ports it is ambiguous and skipped.
    """
    for (device, port, counter), ecn in ib.items():
        if counter != "np_ecn_marked_roce_packets":
            continue
        rcv_port = port or _only_port(ib, device, "port_rcv_packets")
        rcv = ib.get((device, rcv_port or "", "port_rcv_packets"))
        if rcv is not None and _rate(rcv) > 0:
            ratio = _clamp01(_rate(ecn) / _rate(rcv))
            yield _derived(ecn, rcv.reading.port, "ecn_marked_ratio", ratio, "ratio")


def _only_port(ib: Index, device: str, counter: str) -> str | None:
    ports = {p for (d, p, c) in ib if d == device and c == counter and p}
    return ports.pop() if len(ports) == 1 else None


def cnp_rates(ib: Index) -> Iterator[Sample]:
    """CNPs sent as notification point and handled as reaction point, per second."""
    for raw, name in CNP_COUNTERS:
        for (_, _, counter), s in ib.items():
            if counter == raw:
                yield _derived(s, s.reading.port, name, _rate(s), "packets_per_second")


def xmit_wait_lost_bandwidth(ib: Index) -> Iterator[Sample]:
    """Estimated bandwidth lost to credit starvation: rate(port_xmit_wait) x 8 bytes per tick.

    An estimate: the x 8 holds for NVIDIA Quantum switch ports (DOMAIN.md); the tick length of an
    HCA port is implementation-defined, so compare it between ports of one kind, not across kinds.
    """
    for (_, port, counter), s in ib.items():
        if counter == "port_xmit_wait":
            yield _derived(
                s, port, "xmit_wait_lost_bytes_per_second", _rate(s) * XMIT_WAIT_BYTES_PER_TICK, "bytes_per_second"
            )


def errors_per_gigabyte(ib: Index) -> Iterator[Sample]:
    """Symbol and receive errors per 1e9 received bytes (``port_rcv_data`` is already in bytes)."""
    for (device, port, counter), s in ib.items():
        if counter != "port_rcv_data" or _rate(s) <= 0:
            continue
        gigabytes_per_second = _rate(s) / GIGABYTE
        for raw, name in ERRORS_PER_GB:
            err = ib.get((device, port, raw))
            if err is not None:
                yield _derived(err, port, name, _rate(err) / gigabytes_per_second, "errors_per_gigabyte")


def pause_ratios(samples: Sequence[Sample]) -> Iterator[Sample]:
    """Fraction of the interval a priority was paused: rate of pause seconds per second, in [0, 1].

    Inputs are the collectors' vendor-neutral ``rx_pause_duration``/``tx_pause_duration`` readings
    (already converted to seconds, label ``priority``), whatever the driver's own name.
    """
    for s in samples:
        r = s.reading
        name = PAUSE_DURATIONS.get(r.name)
        if name is not None and r.unit == "seconds":
            yield _derived(s, r.port, name, _clamp01(_rate(s)), "ratio", r.labels)


# --- NCCL-tests efficiency (docs/model.md, "Efficiency at the agent") -------------------------------


@dataclass(slots=True)
class NcclRunInputs:
    """What one scrape says about one op's NCCL-tests run."""

    busbw: Sample | None = None  # out-of-place busbw at the largest size
    size: int = 0
    nodes: float | None = None
    ranks: float | None = None
    algo: str = "ring"
    efficiency: float = Fabric.efficiency  # achievable fraction of line rate the model assumes


def nccl_efficiency(inputs: Sequence[Sample]) -> Iterator[Sample]:
    """Measured ÷ predicted bus bandwidth of each NCCL-tests run in this scrape (device = op, label
    ``size`` = the run's largest out-of-place size), predicted by ``fabricd.perfmodel`` on this
    node's active fabric ports. Nothing when a run, its shape or the ports are missing."""
    runs = nccl_runs(s for s in inputs if s.reading.source == NCCL)
    ports = fabric_ports([s.reading for s in inputs if s.reading.source == IB]) if runs else None
    if ports is None:
        return
    for op, run in runs.items():
        value = run_efficiency(op, run, *ports)
        if value is not None and run.busbw is not None:
            labels = (("size", str(run.size)),)
            yield _derived(run.busbw, "", "nccl_efficiency", value, "ratio", labels)


def nccl_runs(samples: Iterator[Sample]) -> dict[str, NcclRunInputs]:
    """The collector's per-run gauges, by op."""
    runs: dict[str, NcclRunInputs] = {}
    for s in samples:
        r = s.reading
        run = runs.setdefault(r.device, NcclRunInputs())
        if r.counter == "busbw":
            _keep_largest(run, s)
        elif r.counter == "nodes":
            run.nodes = r.value
        elif r.counter == "ranks":
            run.ranks = r.value
        elif r.counter == "model_efficiency":
            run.efficiency, run.algo = r.value, dict(r.labels).get("algo", "ring")
    return runs


def _keep_largest(run: NcclRunInputs, s: Sample) -> None:
    labels = dict(s.reading.labels)
    size = labels.get("size", "")
    if labels.get("placement") == "out_of_place" and size.isdigit() and int(size) > run.size:
        run.busbw, run.size = s, int(size)


def fabric_ports(readings: Sequence[Reading]) -> tuple[int, float] | None:
    """(port count, highest link rate in bytes/s) of the node's active fabric ports: the InfiniBand
    ones when any is active, else the Ethernet (RoCE) ones; the rule of ``fabricd model --sysfs-root``."""
    layer = {(r.device, r.port): dict(r.labels).get("link_layer", "") for r in readings if r.counter == "port_info"}
    active = {(r.device, r.port) for r in readings if r.counter == "state" and r.value == IB_PORT_ACTIVE}
    fabric_layer = "InfiniBand" if "InfiniBand" in {layer.get(k) for k in active} else "Ethernet"
    rates = [
        r.value
        for r in readings
        if r.counter == "rate"
        and r.value > 0
        and (r.device, r.port) in active
        and layer.get((r.device, r.port)) == fabric_layer
    ]
    return (len(rates), max(rates)) if rates else None


def run_efficiency(op: str, run: NcclRunInputs, hcas: int, link_rate: float) -> float | None:
    """measured ÷ ``perfmodel.predict`` busbw; None for single-node runs (their bottleneck is
    NVLink or PCIe, which sysfs does not describe) and ops or shapes the model does not cover."""
    if run.busbw is None or run.nodes is None or run.ranks is None or op not in OPS or run.nodes < 2:
        return None
    nodes = int(run.nodes)
    gpus_per_node = int(run.ranks) // nodes
    if gpus_per_node < 1 or not 0 < run.efficiency <= 1:
        return None
    fabric = Fabric(
        link_rate_bytes_per_second=link_rate, hcas_per_node=hcas, gpus_per_node=gpus_per_node, efficiency=run.efficiency
    )
    algo = run.algo if run.algo in ALGOS else "ring"
    predicted = predict(op, run.size, nodes, fabric, algo).busbw_bytes_per_second
    return efficiency(run.busbw.reading.value, predicted)
