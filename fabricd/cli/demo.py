"""``fabricd demo``: everything on one machine on the embedded default (SQLite)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the central service and a simulated cluster on this machine",
        description="Start the central service (SQLite in --data-dir) and one agent per simulated node; "
        "a fault is injected a minute or two in, so incidents appear in the CLI, the REST API and "
        "/metrics. Ctrl-C stops everything.",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:9470",
        metavar="HOST:PORT",
        help="central service address (default 127.0.0.1:9470)",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path("data/demo"),
        metavar="DIR",
        help="demo data folder, wiped at start (default data/demo)",
    )
    p.add_argument(
        "--fixture",
        action="store_true",
        help="instead of a simulation, run one agent on the real captured tree in deploy/demo/sys",
    )
    p.add_argument(
        "--scenario",
        default="demo",
        metavar="NAME",
        help="simulator scenario (default: demo; see fabricd/sim/scenarios/)",
    )
    p.add_argument("--nodes", type=int, default=16, metavar="N", help="simulated nodes (default 16)")
    p.add_argument("--interval", type=float, default=5.0, metavar="SECONDS", help="agents' scrape interval (default 5)")
    p.add_argument(
        "--speed", type=float, default=1.0, metavar="N", help="simulated seconds per real second (default 1)"
    )
    p.add_argument("--duration", type=float, metavar="SECONDS", help="stop by itself after this long")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fabricd import logs
    from fabricd.extras import require

    require("server", "fabricd demo (it runs the central service)")
    from fabricd.sim.demo import DemoOptions
    from fabricd.sim.demo import run as run_demo

    logs.setup("info")
    return run_demo(
        DemoOptions(
            listen=args.listen,
            data_dir=args.data_dir,
            fixture=args.fixture,
            scenario=args.scenario,
            nodes=args.nodes,
            interval_seconds=args.interval,
            speed=args.speed,
            duration_seconds=args.duration,
        )
    )
