"""``fabricd eval``: replay scenarios through the production pipeline, delivered as live, and score it.

The replay (``fabricd.sim.replay``) runs the agent's collectors and pipeline on every simulated
node at its own scrape phase, delivers the batches with a delay, and feeds the central's detection
path (settlement, then the engine). Nothing in a collector or detector knows it is simulated; the
ground truth is only read here, afterwards. ``fabricd eval --live`` (``fabricd.sim.live_eval``)
scores a real run of the server and agents with the same functions.

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
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fabricd.model import Incident
from fabricd.progress import progress
from fabricd.sim.jobs import JOB_COUNTS, job_metrics, score_jobs
from fabricd.sim.replay import EPOCH, replay
from fabricd.sim.scenario import Scenario, load
from fabricd.sim.truth import MATCHING_KINDS, Truth

LATE_INTERVALS = 3  # an incident first reported this long after a fault's end can still be its detection
DEADLINE_INTERVALS = 2  # issue 7: detection within 2 scrape intervals after symptoms reach the counters


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
    detect_seconds: float = 0.0  # time inside settlement and the engine (the bench's detection rate)
    late_samples: int = 0  # samples that arrived after their moment was settled (folded in)
    opened: list[dict[str, Any]] = field(default_factory=list)  # every incident: kind, element, first_ts
    matches: dict[int, list[tuple[float, Incident]]] = field(default_factory=dict)  # truth index -> incidents
    jobs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(JOB_COUNTS, 0))  # fabricd.sim.jobs

    def metrics(self) -> dict[str, Any]:
        out = _metrics(self.faults, self.incidents, self.matched_incidents, len(self.false_positives))
        return {**out, **job_metrics(self.jobs)}


def _metrics(faults: Sequence[FaultResult], incidents: int, matched: int, fps: int) -> dict[str, Any]:
    detected = [f for f in faults if f.detected]
    return {
        "recall": len(detected) / len(faults) if faults else 1.0,
        "precision": matched / incidents if incidents else 1.0,
        "localization_top1": sum(f.correct for f in detected) / len(detected) if detected else 1.0,
        "on_time": sum(f.on_time for f in detected) / len(detected) if detected else 1.0,
        "false_positives": fps,
    }


# --- scoring ------------------------------------------------------------------------------------


def score(name: str, interval: float, truths: list[Truth], seen: dict[str, tuple[float, Incident]]) -> ScenarioResult:
    result = ScenarioResult(name, incidents=len(seen))
    result.opened = [
        {"kind": inc.kind.value, "element": inc.element, "first_ts": first}
        for first, inc in sorted(seen.values(), key=lambda x: (x[0], x[1].key))
    ]
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
    result.matches = matches
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
    result.late_samples = run.late_samples
    topo = scenario.build_topology()
    result.jobs = score_jobs(scenario, topo, EPOCH, run.truths, result.matches, result.false_positives)
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
    out = {**_metrics(faults, incidents, matched, fps), **job_metrics(_job_totals(results))}
    out["faults"] = [asdict(f) for f in faults]
    out["scenarios"] = {
        r.name: {
            **r.metrics(),
            "incidents": r.incidents,
            "false_positive_incidents": r.false_positives,
            "job_counts": r.jobs,
            "scrapes": r.scrapes,
            "samples": r.samples,
            "wall_seconds": round(r.wall_seconds, 3),
            "detect_seconds": round(r.detect_seconds, 3),
            "late_samples": r.late_samples,
            "opened": r.opened,
        }
        for r in results
    }
    return out


def _job_totals(results: Sequence[ScenarioResult]) -> dict[str, int]:
    return {key: sum(r.jobs[key] for r in results) for key in JOB_COUNTS}


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
    lines.append(f"job attribution: precision {rep['job_precision']:.2f}, recall {rep['job_recall']:.2f}")
    return "\n".join(lines) + "\n"


def _summary_line(name: str, m: dict[str, Any]) -> str:
    return (
        f"{name:<22} {m['recall']:>7.2f} {m['precision']:>9.2f} {m['localization_top1']:>6.2f} "
        f"{m['on_time']:>7.2f} {m['false_positives']:>4}"
    )
