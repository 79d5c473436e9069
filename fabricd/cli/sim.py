"""``fabricd sim`` (a simulated cluster the agents can read) and ``fabricd eval`` (score detection)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sim",
        help="run a simulated cluster whose host files the collectors read",
        description="Write, per node, a sysfs tree and ethtool statistics, advance them every interval "
        "(real time, or --speed N times faster), refresh an NCCL-tests stand-in's output and answer "
        "pingmesh probes per the path model. Ground truth goes to DIR/truth.json; the agent config "
        "for each node to DIR/agents/<node>.yaml. Ctrl-C stops.",
    )
    p.add_argument("scenario", nargs="?", help="shipped scenario name (see --list) or a YAML file")
    p.add_argument("--out", type=Path, metavar="DIR", help="folder for the simulated hosts (required)")
    p.add_argument("--list", action="store_true", help="list the shipped scenarios with what each does, and exit")
    p.add_argument("--speed", type=float, default=1.0, metavar="N", help="simulated seconds per wall second")
    p.add_argument("--nodes", type=int, metavar="N", help="override the scenario's node count")
    p.set_defaults(func=run_sim)

    e = sub.add_parser(
        "eval",
        help="replay scenarios through the collectors and detectors and score the incidents",
        description="Replay scenarios in accelerated event time through the production collectors, "
        "rate engine and detection engine, and report per fault: detected, time to detect, blamed "
        "element, correct or not; per scenario and overall: recall, precision, top-1 localization, "
        "false positives. Progress goes to stderr.",
    )
    e.add_argument("scenario", nargs="*", help="scenario names or YAML files (default: all shipped but large, demo)")
    e.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    e.add_argument(
        "--live",
        action="store_true",
        help="run one scenario for real (simulator, server, one agent per node, in real time) and score "
        'the incidents the server opened; the JSON gains "mode": "live"',
    )
    e.add_argument("--duration", type=_duration, metavar="TIME", help="with --live: stop after this long (5m, 300)")
    e.add_argument("--listen", default="127.0.0.1:9471", metavar="HOST:PORT", help="with --live: the server's address")
    e.add_argument(
        "--data-dir", type=Path, default=Path("data/eval-live"), metavar="DIR", help="with --live: wiped at start"
    )
    e.add_argument("--list", action="store_true", help="list the shipped scenarios and exit")
    e.set_defaults(func=run_eval)


def run_sim(args: argparse.Namespace) -> int:
    import yaml

    from fabricd.progress import progress
    from fabricd.sim import live
    from fabricd.sim.scenario import ScenarioError, load

    if args.list:
        sys.stdout.write(scenario_list())
        return 0
    if args.scenario is None or args.out is None:
        print("fabricd sim: give a SCENARIO and --out DIR (fabricd sim --list shows the scenarios)", file=sys.stderr)
        return 2
    try:
        scenario = load(args.scenario, **({"topology": {"nodes": args.nodes}} if args.nodes else {}))
        with progress("sim warm-up", total=scenario.topology.nodes) as step:
            handle = live.start(scenario, args.out, speed=args.speed, step=step)
    except (ScenarioError, ValueError) as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 2
    # SIGTERM (systemd, kill) stops as cleanly as Ctrl-C: responders closed, thread joined.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: _raise_interrupt())
    agents = args.out / "agents"
    agents.mkdir(parents=True, exist_ok=True)
    for node in handle.nodes:
        (agents / f"{node}.yaml").write_text(yaml.safe_dump(handle.agent_config(node), sort_keys=False))
    print(
        f"simulating {handle.scenario.name}: {len(handle.nodes)} nodes under {args.out}/nodes, "
        f"x{args.speed:g}; agent configs in {agents}; ground truth in {args.out}/truth.json",
        file=sys.stderr,
    )
    print(
        f"  e.g. fabricd agent --node {handle.nodes[0]} --sysfs-root {handle.sysfs_root(handle.nodes[0])} "
        f"--config {agents / (handle.nodes[0] + '.yaml')}",
        file=sys.stderr,
    )
    try:
        while handle._thread is not None and handle._thread.is_alive():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        handle.stop()
    return 1 if handle.error else 0


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


def scenario_list() -> str:
    """One line per shipped scenario: its name and its description, aligned."""
    from fabricd.sim.scenario import load, shipped

    names = shipped()
    width = max(map(len, names), default=0)
    return "".join(f"{name:<{width}}  {' '.join(load(name).description.split())}\n" for name in names)


def default_scenarios() -> list[str]:
    from fabricd.sim.scenario import shipped

    return [n for n in shipped() if n not in {"large", "demo"}]


def run_eval(args: argparse.Namespace) -> int:
    from fabricd.sim import eval as ev
    from fabricd.sim.scenario import ScenarioError

    if args.list:
        sys.stdout.write(scenario_list())
        return 0
    if args.live:
        return _run_live(args)
    try:
        report = ev.evaluate_all(args.scenario or default_scenarios(), show_progress=True)
    except ScenarioError as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, separators=(",", ":")))
    else:
        sys.stdout.write(ev.render_text(report))
    return 0


def _duration(text: str) -> float:
    from fabricd.sim.scenario import seconds

    try:
        return seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _run_live(args: argparse.Namespace) -> int:
    from fabricd.sim import eval as ev
    from fabricd.sim.live_eval import LiveOptions, evaluate_live
    from fabricd.sim.scenario import ScenarioError

    if len(args.scenario) != 1:
        print("fabricd eval --live: give exactly one scenario (it runs in real time)", file=sys.stderr)
        return 2
    opts = LiveOptions(args.scenario[0], args.duration, args.listen, args.data_dir)
    try:
        report = evaluate_live(opts)
    except ScenarioError as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"fabricd eval --live: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, separators=(",", ":")))
    else:
        sys.stdout.write(ev.render_text(report))
    return 0
