"""Scenario files: the simulated cluster, its workload and the faults injected into it.

The schema is a contract (docs/simulator.md); it may grow, never break::

    name: congested-uplink
    seed: 7
    duration: 30m          # simulated time
    interval: 10s          # scrape interval
    topology: {nodes: 64, hcas_per_node: 8, nodes_per_leaf: 16, spines: 4, link_layer: roce,
               names: {node: "gpu-a{:02d}", leaf: "leaf-{:02d}", spine: "spine-{:02d}"}}  # names optional
    workload: {kind: allreduce, load: 0.6}
    faults:
      - {kind: congestion, at: leaf-02~spine-01, start: 10m, end: 20m, severity: 0.5}
    jobs:                  # placed on nodes (Slurm host lists); fabricd eval scores job attribution
      - {id: "101", user: alice, name: pretrain, nodes: "node-[001-008]", start: 0s, end: 30m}

Everything is validated at load; an error names the file and the key, and a fault whose ``at`` is
not an element of the right type in the topology is rejected (``faults[0].at: ...``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fabricd import topology as topo_mod

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
FAULT_KINDS = ("congestion", "lossy_link", "link_flap", "pfc_storm", "hol_blocking", "straggler")
# What a fault may be placed on (element type), per kind.
LINK_FAULTS = frozenset({"congestion", "lossy_link", "link_flap"})
PORT_FAULTS = frozenset({"pfc_storm", "hol_blocking"})
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class ScenarioError(ValueError):
    """An invalid scenario; the message names the file and the key."""


def seconds(value: Any) -> float:
    """``30m``, ``10s``, ``1h``, ``250ms`` or a number of seconds (>= 0)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration (use 10s, 5m, 1h)")
    if isinstance(value, int | float):
        number = float(value)
    else:
        match = _DURATION.match(str(value))
        if match is None:
            raise ValueError(f"{value!r} is not a duration (use 10s, 5m, 1h)")
        number = float(match.group(1)) * _UNIT[match.group(2) or "s"]
    if number < 0:
        raise ValueError("a duration cannot be negative")
    return number


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NamesSpec(_Strict):
    """How hosts and switches are named (``str.format`` templates of their 1-based number), so a
    scenario can name them the way real sites do: ``{node: "dgx-h100-{:03d}", leaf: "ib-leaf-{}"}``."""

    node: str = Field(default=topo_mod.Naming().node, min_length=1, max_length=48)
    leaf: str = Field(default=topo_mod.Naming().leaf, min_length=1, max_length=48)
    spine: str = Field(default=topo_mod.Naming().spine, min_length=1, max_length=48)

    @model_validator(mode="after")
    def _usable(self) -> NamesSpec:
        self.naming().check()
        return self

    def naming(self) -> topo_mod.Naming:
        return topo_mod.Naming(self.node, self.leaf, self.spine)


class TopologySpec(_Strict):
    nodes: int = Field(ge=2, le=4096)
    hcas_per_node: int = Field(default=8, ge=1, le=16)
    nodes_per_leaf: int = Field(default=16, ge=1)
    spines: int = Field(default=4, ge=1, le=64)
    link_layer: Literal["roce", "infiniband"] = "roce"
    rate_gbps: int = Field(default=400, gt=0)  # per HCA port: 400 Gb/s (4X NDR) like the gpud capture
    names: NamesSpec = Field(default_factory=NamesSpec)


class WorkloadSpec(_Strict):
    kind: Literal["allreduce", "alltoall"] = "allreduce"
    load: float = Field(default=0.6, ge=0.0, le=0.95)  # background traffic, fraction of line rate
    noise: float = Field(default=0.05, ge=0.0, le=0.5)  # relative jitter per interval, from the seed
    probe_peers: int = Field(default=4, ge=0, le=64)  # pingmesh peers per node
    probe_rate: float = Field(default=10.0, gt=0, le=100)  # probes/s per peer (Pingmesh: ~10/s)
    nccl: bool = True  # every node runs an NCCL-tests stand-in every ``nccl_every``
    nccl_every: float | None = None  # seconds; default: the scrape interval
    nccl_sizes: int = Field(default=4, ge=1, le=24)  # message sizes per run (8 MiB x 8^k)

    @field_validator("nccl_every", mode="before")
    @classmethod
    def _every(cls, value: Any) -> float | None:
        return None if value is None else seconds(value)


class FaultSpec(_Strict):
    kind: Literal["congestion", "lossy_link", "link_flap", "pfc_storm", "hol_blocking", "straggler"]
    at: str
    start: float
    end: float
    severity: float = Field(default=0.5, gt=0.0, le=1.0)

    @field_validator("start", "end", mode="before")
    @classmethod
    def _time(cls, value: Any) -> float:
        return seconds(value)

    @model_validator(mode="after")
    def _ordered(self) -> FaultSpec:
        if self.end <= self.start:
            raise ValueError("end must be after start")
        return self


class HostJitterSpec(_Strict):
    """Host scheduling noise on each probe's RTT (both ends' kernels and event loops), as a loaded
    host really shows it. Defaults from fabricd's own prober and responder on loopback, with both
    CPUs busy (bench/rtt_jitter.py; docs/detection.md "Measured jitter"): per 5 s window the
    minimum sits at ~125 us and moves by ~10-15 us, the median ~230 us, while p90 reaches ~3.5 ms
    and p99 ~14 ms (scheduling stalls), varying by milliseconds between windows."""

    probe_median_seconds: float = Field(default=250e-6, ge=0)  # typical host part of one probe's RTT
    probe_spread: float = Field(default=0.45, ge=0)  # lognormal sigma, probe to probe
    level_spread: float = Field(default=0.25, ge=0)  # lognormal sigma of a host's load, interval to interval
    pair_spread: float = Field(default=0.1, ge=0)  # lognormal sigma of a pair's fixed offset
    spike_rate: float = Field(default=0.05, ge=0, le=1)  # fraction of probes caught by a scheduling stall
    spike_median_seconds: float = Field(default=10e-3, ge=0)
    floor_seconds: float = Field(default=110e-6, ge=0)  # the least any probe costs the hosts (rtt_min)


class LateSpec(_Strict):
    """One agent whose batches arrive ``delay`` late (a slow link to the central, a busy host), or
    none at all from ``start`` to ``end`` (``silent``: it spools, then replays the spool)."""

    node: str
    start: float = 0.0
    end: float = float("inf")
    delay: float = Field(default=0.0, ge=0)
    silent: bool = False

    @field_validator("start", "end", "delay", mode="before")
    @classmethod
    def _time(cls, value: Any) -> float:
        return seconds(value)


class DeliverySpec(_Strict):
    """How the agents' data reaches the central (docs/simulator.md, "Delivery"). ``live`` (the
    default) is what a deployment does: each agent scrapes at its own phase of the interval (seeded),
    each batch takes ``delay`` ± ``jitter`` seconds, some agents are late or silent, probe RTTs
    carry host jitter. ``aligned`` is the old idealization for unit tests: every node at once, no
    delay, no host jitter."""

    mode: Literal["live", "aligned"] = "live"
    delay: float = Field(default=1.0, ge=0)  # the agent's batch wait (<= 1 s) plus the network
    jitter: float = Field(default=0.5, ge=0)
    late: list[LateSpec] = Field(default_factory=list)
    host_jitter: HostJitterSpec = Field(default_factory=HostJitterSpec)

    @field_validator("delay", "jitter", mode="before")
    @classmethod
    def _time(cls, value: Any) -> float:
        return seconds(value)

    @property
    def live(self) -> bool:
        return self.mode == "live"


class JobSpec(_Strict):
    """A job placed on nodes for its lifetime (docs/jobs.md): what incidents should name."""

    id: str = Field(pattern=r"^[0-9A-Za-z_.+-]{1,64}$")
    user: str = Field(default="sim", max_length=64)
    name: str = Field(default="", max_length=64)
    nodes: tuple[str, ...] = Field(min_length=1)
    start: float = 0.0
    end: float | None = None  # default: the scenario's end

    @field_validator("nodes", mode="before")
    @classmethod
    def _hostlist(cls, value: Any) -> Any:
        from fabricd.jobfiles import expand_hostlist

        return expand_hostlist(value) if isinstance(value, str) else value

    @field_validator("start", "end", mode="before")
    @classmethod
    def _time(cls, value: Any) -> float | None:
        return None if value is None else seconds(value)


class Scenario(_Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str = ""
    seed: int = 0
    duration: float
    interval: float
    topology: TopologySpec
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    faults: list[FaultSpec] = Field(default_factory=list)
    delivery: DeliverySpec = Field(default_factory=DeliverySpec)
    jobs: list[JobSpec] = Field(default_factory=list)

    @field_validator("duration", "interval", mode="before")
    @classmethod
    def _time(cls, value: Any) -> float:
        return seconds(value)

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if self.interval <= 0 or self.duration < 2 * self.interval:
            raise ValueError("duration must cover at least two intervals of a positive length")
        for i, fault in enumerate(self.faults):
            if fault.end > self.duration:
                raise ValueError(f"faults[{i}].end: after the scenario's duration")
        ids = [job.id for job in self.jobs]
        for i, job in enumerate(self.jobs):
            if ids.index(job.id) != i:
                raise ValueError(f"jobs[{i}].id: {job.id!r} is already jobs[{ids.index(job.id)}]")
        return self

    @property
    def sim_step(self) -> float:
        """The model moves in quarter intervals: agents scraping at different phases see the
        fabric change between their scrapes, as on a real one."""
        return self.interval / 4

    @property
    def nccl_every(self) -> float:
        return self.workload.nccl_every or self.interval

    def build_topology(self) -> topo_mod.Topology:
        t = self.topology
        return topo_mod.fat_tree(
            t.nodes, t.hcas_per_node, t.nodes_per_leaf, t.spines, link_layer=t.link_layer, names=t.names.naming()
        )


def check_elements(scenario: Scenario, topology: topo_mod.Topology) -> None:
    """Every fault sits on an element of the type its kind needs; raises ScenarioError naming it."""
    for i, fault in enumerate(scenario.faults):
        problem = _element_problem(fault, topology, scenario.topology.link_layer)
        if problem:
            raise ScenarioError(f"faults[{i}].at: {problem}")
    for i, job in enumerate(scenario.jobs):
        unknown = [n for n in job.nodes if n not in topology.nodes]
        if unknown:
            raise ScenarioError(f"jobs[{i}].nodes: {unknown[0]!r} is not a node (e.g. node-001)")


def _element_problem(fault: FaultSpec, topology: topo_mod.Topology, link_layer: str) -> str:
    if fault.kind in LINK_FAULTS and fault.at not in topology.links:
        return f"{fault.at!r} is not a link (e.g. leaf-01~spine-01 or node-001/mlx5_0~leaf-01)"
    if fault.kind in PORT_FAULTS and fault.at not in topology.hca_ports:
        return f"{fault.at!r} is not an HCA port (e.g. node-001/mlx5_0)"
    if fault.kind == "straggler" and fault.at not in topology.nodes:
        return f"{fault.at!r} is not a node (e.g. node-001)"
    if fault.kind == "pfc_storm" and link_layer != "roce":
        return "pfc_storm needs link_layer roce (InfiniBand has no PFC: it uses credits)"
    return ""


def parse(data: Any, source: str = "<scenario>") -> Scenario:
    """A validated scenario from a decoded YAML mapping."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario is a mapping (name, seed, duration, ...)")
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise ScenarioError(f"{source}: {key}: {first['msg']}") from exc
    try:
        topology = scenario.build_topology()
    except ValueError as exc:  # names that collide (a host named like a switch)
        raise ScenarioError(f"{source}: topology.names: {exc}") from exc
    try:
        check_elements(scenario, topology)
    except ScenarioError as exc:
        raise ScenarioError(f"{source}: {exc}") from exc
    return scenario


def shipped() -> list[str]:
    """Names of the scenarios shipped with fabricd (``fabricd/sim/scenarios/*.yaml``)."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def resolve_path(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.suffix in {".yaml", ".yml"} or path.exists():
        return path
    return SCENARIO_DIR / f"{name_or_path}.yaml"


def load(name_or_path: str | Path, **overrides: Any) -> Scenario:
    """A shipped scenario by name (``clean``) or a YAML file; ``overrides`` replace top-level keys
    (``topology`` entries merge: ``load("demo", topology={"nodes": 32})``)."""
    path = resolve_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        known = ", ".join(shipped())
        raise ScenarioError(f"{path}: cannot read scenario ({exc.strerror}); shipped: {known}") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
    if isinstance(data, dict):
        for key, value in overrides.items():
            data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return parse(data, str(path))
