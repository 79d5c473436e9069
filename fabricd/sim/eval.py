"""``fabricd eval``: replay scenarios in event time through the production pipeline and score it.

For each scrape of the scenario (every ``interval`` of simulated time) the simulated hosts' files
move on (``fabricd.sim.cluster``), then the *same* collectors the agent runs read them (built by
``fabricd.collector.build_collectors``; only side effects are swapped through their typed
factories: the clocks, the NCCL-tests command runner, the probe sender and the read worker), then
the agent's ``ScrapePipeline`` turns readings into samples, and ``DetectionEngine.process`` sees them as the central service does. Nothing in a
collector or detector knows it is simulated; the ground truth is only read here, afterwards.

Scoring (docs/simulator.md):

- an incident *matches* a fault when its kind is one the fault should raise (``truth.MATCHING_KINDS``),
  it was first reported between the fault's start and ``end + 3 intervals``, and its element is in
  the fault's scope; otherwise it is a false positive;
- a fault is *detected* when an incident matches it; time to detect = first report - fault start;
  *on time* when first reported by ``symptom_ts + 2 intervals`` (the issue 7 target);
- localization is *correct* when the element of the earliest matching incident is one of the
  fault's ``correct`` elements (top-1);
- recall = detected / faults; precision = matching incidents / incidents; top-1 = correct / detected.
"""

from __future__ import annotations

import asyncio
import resource
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any, TextIO

from fabricd import gctune
from fabricd.clock import ManualClock
from fabricd.collector import Collector, CollectorFactories
from fabricd.command import CommandResult
from fabricd.model import Incident, Reading, Sample
from fabricd.pipeline import ScrapePipeline
from fabricd.progress import Step, progress, quiet
from fabricd.sim.cluster import SimCluster, create
from fabricd.sim.probes import model_prober
from fabricd.sim.scenario import Scenario, load
from fabricd.sim.truth import MATCHING_KINDS, Truth

EPOCH = 1_700_000_000.0  # event time of scenario time 0 in replays (fixed: runs are deterministic)
LATE_INTERVALS = 3  # an incident first reported this long after a fault's end can still be its detection
DEADLINE_INTERVALS = 2  # issue 7: detection within 2 scrape intervals after symptoms reach the counters
FD_RESERVE = 2048  # file descriptors left for everything but the collectors' open counter files


@dataclass(frozen=True)
class FaultResult:
    scenario: str
    kind: str
    element: str
    start_ts: float
    symptom_ts: float
    detected: bool
    detect_ts: float | None
    time_to_detect_seconds: float | None
    on_time: bool
    blamed: str | None
    blamed_kind: str | None
    correct: bool


@dataclass
class ScenarioResult:
    name: str
    faults: list[FaultResult] = field(default_factory=list)
    incidents: int = 0
    matched_incidents: int = 0
    false_positives: list[dict[str, Any]] = field(default_factory=list)
    scrapes: int = 0
    samples: int = 0
    wall_seconds: float = 0.0
    detect_seconds: float = 0.0  # time inside DetectionEngine.process (the bench's detection rate)

    def metrics(self) -> dict[str, Any]:
        return _metrics(self.faults, self.incidents, self.matched_incidents, len(self.false_positives))


def _metrics(faults: Sequence[FaultResult], incidents: int, matched: int, fps: int) -> dict[str, Any]:
    detected = [f for f in faults if f.detected]
    return {
        "recall": len(detected) / len(faults) if faults else 1.0,
        "precision": matched / incidents if incidents else 1.0,
        "localization_top1": sum(f.correct for f in detected) / len(detected) if detected else 1.0,
        "on_time": sum(f.on_time for f in detected) / len(detected) if detected else 1.0,
        "false_positives": fps,
    }


# --- the replay ---------------------------------------------------------------------------------


@dataclass
class Node:
    name: str
    collectors: dict[str, Collector]
    pipeline: ScrapePipeline


def _collector_options(cluster: SimCluster, node: str, fd_budget: int) -> dict[str, dict[str, Any]]:
    # The agent config `fabricd sim` prints; the probe ports are placeholders, since the pingmesh
    # collector gets a path-model prober (``_build_nodes``) instead of a UDP socket.
    ports = {(p.src, p.dst): 7 for p in cluster.sim.fabric.probes if p.src == node}
    cfg = cluster.collectors_config(node, probe_ports=ports)
    cfg["infiniband"] = {"max_open_files": fd_budget}
    return cfg


class _ModelRunner:
    """The NCCL collector's command runner: prints what the stand-in command would print now."""

    def __init__(self, cluster: SimCluster, node: str, clock: ManualClock) -> None:
        self.cluster, self.node, self.clock = cluster, node, clock

    async def run(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult:
        del argv, timeout_seconds
        text = self.cluster.nccl_output(self.node, self.clock.now - self.cluster.epoch)
        return CommandResult(text, 0, duration_seconds=1.0)


def _factories(cluster: SimCluster, node: str, clock: ManualClock) -> tuple[CollectorFactories, ...]:
    """The simulated side effects of one node: event-time clocks, the stand-in NCCL runs, path-model
    probes, and reads of tmpfs inline (``fabricd.worker.InlineWorker``)."""
    from collectors.infiniband import InfinibandFactories
    from collectors.nccl import NcclFactories
    from collectors.pingmesh import PingmeshFactories
    from fabricd.worker import InlineWorker

    return (
        NcclFactories(runner=lambda: _ModelRunner(cluster, node, clock), monotonic=clock.time, wall_clock=clock.time),
        PingmeshFactories(
            prober=lambda targets, _timeout_ns: model_prober(cluster.sim, node, targets, lambda: int(clock.now * 1e9))
        ),
        InfinibandFactories(worker=InlineWorker),
    )


def _build_nodes(cluster: SimCluster, clock: ManualClock) -> list[Node]:
    from collectors import REGISTRY
    from fabricd.collector import build_collectors

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    budget = max(0, min(1024, (soft - FD_RESERVE) // max(1, len(cluster.nodes))))
    nodes = []
    for name in cluster.nodes:
        collectors = build_collectors(
            _collector_options(cluster, name, budget),
            node=name,
            sysfs_root=cluster.sysfs_root(name),
            registry=REGISTRY,
            factories=_factories(cluster, name, clock),
        )
        nodes.append(Node(name, collectors, ScrapePipeline()))
    return nodes


async def _scrape(nodes: list[Node], ts: float) -> list[tuple[str, Sample]]:
    results = await asyncio.gather(*(_collect_node(n) for n in nodes))
    batch: list[tuple[str, Sample]] = []
    for node, readings in zip(nodes, results, strict=True):
        batch.extend(zip(repeat(node.name), node.pipeline.samples(ts, readings)))
    return batch


async def _collect_node(node: Node) -> list[Reading]:
    # In order and without the agent's runner: event time is the clock's, and a replay has no
    # hung reads to bound (every read is of tmpfs).
    out: list[Reading] = []
    for collector in node.collectors.values():
        out.extend(await collector.collect())
    return out


async def _close(nodes: list[Node]) -> None:
    from fabricd.collector import close_collectors

    for node in nodes:
        await close_collectors(node.collectors.values())


@dataclass
class Replay:
    truths: list[Truth]
    seen: dict[str, tuple[float, Incident]]  # incident key -> (first report ts, last version)
    scrapes: int
    samples: int
    detect_seconds: float


async def replay(scenario: Scenario, workdir: Path, step: Step = quiet) -> Replay:
    """Run one scenario through the collectors, the rate engine and the detection engine."""
    # A replay allocates millions of short-lived readings and samples beside a large long-lived
    # state; with the default GC thresholds the collector took a third of ``eval large``.
    with gctune.raised():
        return await _replay(scenario, workdir, step)


async def _replay(scenario: Scenario, workdir: Path, step: Step) -> Replay:
    from fabricd.detect.engine import DetectionEngine

    cluster = create(scenario, workdir, EPOCH)
    clock = ManualClock(EPOCH)
    engine = DetectionEngine()
    engine.set_topology(cluster.sim.fabric.topology, cluster.routes())
    nodes = _build_nodes(cluster, clock)
    seen: dict[str, tuple[float, Incident]] = {}
    ticks = int(scenario.duration // scenario.interval)
    samples = 0
    detect_seconds = 0.0
    try:
        for k in range(ticks + 1):
            t = k * scenario.interval
            cluster.advance_to(t)
            clock.now = EPOCH + t
            batch = await _scrape(nodes, clock.now)
            samples += len(batch)
            started = time.perf_counter()
            changed = engine.process(batch)
            detect_seconds += time.perf_counter() - started
            for inc in changed:
                first = seen[inc.key][0] if inc.key in seen else clock.now
                seen[inc.key] = (first, inc)
            await asyncio.sleep(0)  # let started NCCL runs finish before the next scrape
            step(note=f"{t:.0f}/{scenario.duration:.0f} s simulated, {len(seen)} incident(s)")
    finally:
        await _close(nodes)
    return Replay(cluster.truths(), seen, ticks + 1, samples, detect_seconds)


# --- scoring ------------------------------------------------------------------------------------


def score(name: str, interval: float, truths: list[Truth], seen: dict[str, tuple[float, Incident]]) -> ScenarioResult:
    result = ScenarioResult(name, incidents=len(seen))
    matches: dict[int, list[tuple[float, Incident]]] = {t.index: [] for t in truths}
    for first, inc in sorted(seen.values(), key=lambda x: x[0]):
        truth = _match(inc, first, truths, interval)
        if truth is None:
            result.false_positives.append(_describe(inc, first))
        else:
            result.matched_incidents += 1
            matches[truth.index].append((first, inc))
    for truth in truths:
        result.faults.append(_fault_result(name, truth, matches[truth.index], interval))
    return result


def _match(inc: Incident, first: float, truths: list[Truth], interval: float) -> Truth | None:
    candidates = [
        t
        for t in truths
        if inc.kind.value in MATCHING_KINDS[t.kind]
        and t.start_ts <= first <= t.end_ts + LATE_INTERVALS * interval
        and inc.element in t.scope
    ]
    exact = [t for t in candidates if inc.element in t.correct]
    best = exact or candidates
    return best[0] if best else None


def _fault_result(name: str, t: Truth, found: list[tuple[float, Incident]], interval: float) -> FaultResult:
    if not found:
        return FaultResult(
            name, t.kind, t.element, t.start_ts, t.symptom_ts, False, None, None, False, None, None, False
        )
    right = [f for f in found if f[1].element in t.correct]
    first, inc = (right or found)[0]
    return FaultResult(
        name,
        t.kind,
        t.element,
        t.start_ts,
        t.symptom_ts,
        True,
        first,
        first - t.start_ts,
        first <= t.symptom_ts + DEADLINE_INTERVALS * interval,
        inc.element,
        inc.kind.value,
        inc.element in t.correct,
    )


def _describe(inc: Incident, first: float) -> dict[str, Any]:
    return {"kind": inc.kind.value, "element": inc.element, "first_ts": first, "summary": inc.summary}


# --- entry points -------------------------------------------------------------------------------


def evaluate(scenario: Scenario, show_progress: bool = False, stream: TextIO | None = None) -> ScenarioResult:
    """Replay and score one scenario; progress (a bar on a terminal, plain lines otherwise) on demand."""
    started = time.perf_counter()
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None  # tmpfs: sysfs-like file costs
    with tempfile.TemporaryDirectory(prefix=f"fabricd-eval-{scenario.name}-", dir=base) as tmp:
        if show_progress:
            ticks = int(scenario.duration // scenario.interval) + 1
            with progress(f"eval {scenario.name}", total=ticks, stream=stream) as step:
                run = asyncio.run(replay(scenario, Path(tmp), step))
        else:
            run = asyncio.run(replay(scenario, Path(tmp)))
    result = score(scenario.name, scenario.interval, run.truths, run.seen)
    result.scrapes, result.samples, result.detect_seconds = run.scrapes, run.samples, run.detect_seconds
    result.wall_seconds = time.perf_counter() - started
    return result


def evaluate_all(names: Sequence[str], show_progress: bool = True, stream: TextIO | None = None) -> dict[str, Any]:
    """Evaluate scenarios by name or path; the report ``fabricd eval --json`` prints."""
    results = [evaluate(load(n), show_progress, stream) for n in names]
    return report(results)


def report(results: Sequence[ScenarioResult]) -> dict[str, Any]:
    faults = [f for r in results for f in r.faults]
    incidents = sum(r.incidents for r in results)
    matched = sum(r.matched_incidents for r in results)
    fps = sum(len(r.false_positives) for r in results)
    out = _metrics(faults, incidents, matched, fps)
    out["faults"] = [asdict(f) for f in faults]
    out["scenarios"] = {
        r.name: {
            **r.metrics(),
            "incidents": r.incidents,
            "false_positive_incidents": r.false_positives,
            "scrapes": r.scrapes,
            "samples": r.samples,
            "wall_seconds": round(r.wall_seconds, 3),
            "detect_seconds": round(r.detect_seconds, 3),
        }
        for r in results
    }
    return out


def render_text(rep: dict[str, Any]) -> str:
    """The human table ``fabricd eval`` prints."""
    lines = [f"{'scenario':<22} {'fault':<13} {'element':<28} {'det':<4} {'ttd':>6} {'ok':<3} blamed"]
    for f in rep["faults"]:
        ttd = "-" if f["time_to_detect_seconds"] is None else f"{f['time_to_detect_seconds']:.0f}s"
        lines.append(
            f"{f['scenario']:<22} {f['kind']:<13} {f['element']:<28} "
            f"{'yes' if f['detected'] else 'NO':<4} {ttd:>6} {'yes' if f['correct'] else 'no':<3} "
            f"{f['blamed'] or '-'}"
        )
    lines.append("")
    lines.append(f"{'scenario':<22} {'recall':>7} {'precision':>9} {'top1':>6} {'on_time':>7} {'FP':>4} {'wall':>7}")
    for name, s in rep["scenarios"].items():
        lines.append(_summary_line(name, s) + f" {s['wall_seconds']:>6.1f}s")
    lines.append(_summary_line("overall", rep))
    return "\n".join(lines) + "\n"


def _summary_line(name: str, m: dict[str, Any]) -> str:
    return (
        f"{name:<22} {m['recall']:>7.2f} {m['precision']:>9.2f} {m['localization_top1']:>6.2f} "
        f"{m['on_time']:>7.2f} {m['false_positives']:>4}"
    )
