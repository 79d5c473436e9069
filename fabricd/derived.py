"""Derived signals computed from one scrape's samples (``source="derived"``, gauges, unit in the name).

Every signal is defined in ``fabricd.signal_table`` (inputs, formula, unit, help) and computed by
its function in ``fabricd.signal_math`` (with any floor): the detectors and the report call the same
one. Here the scrape's samples are gathered per source and device, split into the same scopes
(ports, priorities, qdiscs) and every signal the agent exports is evaluated. Only inputs with an honest rate (status OK or WRAPPED) are
used: a first sighting, a reset or a saturated counter yields no derived value rather than a wrong
one. Assumptions and sources are in ``docs/counters.md`` ("Derived signals"); the NCCL-tests
efficiency (gauges in, a model prediction against the node's own ports) in ``docs/model.md``
("Efficiency at the agent").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from fabricd import signal_table as table
from fabricd.model import Kind, Labels, Reading, Sample, Status, labels_of
from fabricd.perfmodel import ALGOS, GBIT, OPS, Fabric, efficiency, predict
from fabricd.signal_math import join_device_level

SOURCE = "derived"
IB = table.IB
NCCL = table.NCCL
IB_PORT_ACTIVE = 4.0  # sysfs ``state``: "4: ACTIVE"
_OK, _WRAPPED, _COUNTER = Status.OK, Status.WRAPPED, Kind.COUNTER
# Gauges and infos the NCCL efficiency reads (no rate): the NCCL run, the node's fabric ports.
MODEL_INPUTS = frozenset(
    {"busbw_bytes_per_second", "nodes", "ranks", "model_efficiency", "link_rate", "port_state", "port_info"}
)
# The inputs of the signals the agent exports, per source (only the names those signals read).
_INPUTS = {
    src: frozenset(n for sig in sigs for slot in sig.inputs for n in slot) & table.SOURCE_INPUTS[src]
    for src, sigs in table.AGENT_BY_SOURCE.items()
    if sigs
}
_ANY = frozenset().union(*_INPUTS.values()) | MODEL_INPUTS

Scopes = dict[tuple[str, Labels], dict[str, float]]  # one (source, device): (port, labels) -> metric -> value


def derive(samples: Sequence[Sample]) -> list[Sample]:
    """Every derived signal the inputs allow."""
    model: list[Sample] = []
    groups = index_inputs(samples, model)
    out: list[Sample] = []
    for (source, device), (ts, scopes) in groups.items():
        signals = table.AGENT_BY_SOURCE[source]
        for (port, labels), scope in join_device_level(scopes).items():
            for signal, value in table.evaluate(scope, signals):
                out.append(_derived(ts, device, port, signal.name, value, labels, signal.unit))
    if model:
        out.extend(nccl_efficiency(model))
    return out


def index_inputs(
    samples: Sequence[Sample], model: list[Sample] | None = None
) -> dict[tuple[str, str], tuple[float, Scopes]]:
    """One pass over a scrape: the signal inputs by (source, device), in scopes (port, labels) of
    ``metric -> rate`` (counters, honest only) or value (gauges), the grouping of
    ``fabricd.signal_math.scopes``; a repeated key keeps its last sample. When ``model`` is given,
    the samples named in ``MODEL_INPUTS`` are appended to it.

    Runs on every scrape over every sample, so most samples cost one set lookup of an interned name;
    only the candidates have their kind and status checked (by identity: an enum's hash is a Python
    call), and a collector's readings of one port come together, so the scope is looked up again
    only when the port changes.
    """
    groups: dict[tuple[str, str], tuple[float, Scopes]] = {}
    inputs, candidates = _INPUTS, _ANY
    scope: dict[str, float] = {}
    where: tuple[str, str, str, Labels] | None = None  # (source, device, port, labels) of ``scope``
    for s in samples:
        r = s.reading
        metric = r.name or r.counter
        if metric not in candidates:  # most samples: one set lookup
            continue
        if model is not None and metric in MODEL_INPUTS:
            model.append(s)
        wanted = inputs.get(r.source)
        if wanted is None or metric not in wanted:
            continue
        if r.kind is _COUNTER:
            status = s.status
            value = s.rate if status is _OK or status is _WRAPPED else None
        else:
            value = r.value
        if where is None or r.port != where[2] or r.device != where[1] or r.labels != where[3] or r.source != where[0]:
            where = (r.source, r.device, r.port, r.labels)
            group = groups.get(where[:2])
            if group is None:
                group = groups[where[:2]] = (s.ts, {})
            scope = group[1].setdefault((r.port, r.labels), {})
        if value is None:
            scope.pop(metric, None)  # no honest rate this scrape: no input
        else:
            scope[metric] = value
    return groups


def _derived(ts: float, device: str, port: str, name: str, value: float, labels: Labels, unit: str) -> Sample:
    return Sample(ts, Reading(SOURCE, device, port, name, value, unit, Kind.GAUGE, labels, name, 0))


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
            ts, device = run.busbw.ts, run.busbw.reading.device
            yield _derived(ts, device, "", "nccl_efficiency", value, (("size", str(run.size)),), "ratio")
            info = Reading(SOURCE, device, "", MODEL_INFO, 1.0, "", Kind.INFO, model_labels(run, *ports), MODEL_INFO, 0)
            yield Sample(ts, info)


# The model an efficiency was judged against, as an info series beside it (value 1): the node's
# ports as its sysfs gave them and the job's shape, so a low efficiency can be read against them.
MODEL_INFO = "nccl_efficiency_model"
MODEL_INFO_LABELS = ("size", "hcas", "link_rate_gbps", "nodes", "gpus_per_node", "algo", "efficiency")
MODEL_INFO_HELP = (
    "The model nccl_efficiency was judged against (value 1): this node's active fabric ports and rate "
    "from its sysfs, and the run's job shape, algorithm and model efficiency"
)


def model_labels(run: NcclRunInputs, hcas: int, link_rate: float) -> Labels:
    nodes = int(run.nodes or 0)
    return labels_of(
        {
            "size": str(run.size),
            "hcas": str(hcas),
            "link_rate_gbps": f"{link_rate / GBIT:g}",
            "nodes": str(nodes),
            "gpus_per_node": str(int(run.ranks or 0) // max(nodes, 1)),
            "algo": run.algo if run.algo in ALGOS else "ring",
            "efficiency": f"{run.efficiency:g}",
        }
    )


def nccl_runs(samples: Iterator[Sample]) -> dict[str, NcclRunInputs]:
    """The collector's per-run gauges, by op."""
    runs: dict[str, NcclRunInputs] = {}
    for s in samples:
        r = s.reading
        run = runs.setdefault(r.device, NcclRunInputs())
        name = r.name or r.counter
        if name == "busbw_bytes_per_second":
            _keep_largest(run, s)
        elif name == "nodes":
            run.nodes = r.value
        elif name == "ranks":
            run.ranks = r.value
        elif name == "model_efficiency":
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
    layer = {(r.device, r.port): dict(r.labels).get("link_layer", "") for r in readings if r.name == "port_info"}
    active = {(r.device, r.port) for r in readings if r.name == "port_state" and r.value == IB_PORT_ACTIVE}
    fabric_layer = "InfiniBand" if "InfiniBand" in {layer.get(k) for k in active} else "Ethernet"
    rates = [
        r.value
        for r in readings
        if r.name == "link_rate"
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
