"""``fabricd agent``: the always-on per-node agent."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fabricd.cli.common import add_config_option, settings_or_exit, sysfs_root_or_exit
from fabricd.settings import DEFAULT_LISTEN


def register(sub: Any) -> None:
    p = sub.add_parser(
        "agent",
        help="run the per-node agent",
        description="Scrape this node's collectors every interval, compute rates, and stream batches to "
        "the central service; batches are spooled on disk while it is unreachable.",
    )
    add_config_option(p)
    p.add_argument("--central", metavar="URL", help=f"central service URL (default http://{DEFAULT_LISTEN})")
    p.add_argument("--node", metavar="NAME", help="this node's name (default: hostname)")
    p.add_argument("--sysfs-root", type=Path, metavar="DIR", help="sysfs mount to read (default /sys)")
    p.add_argument(
        "--interval", dest="interval_seconds", type=float, metavar="SECONDS", help="scrape interval (default 10)"
    )
    p.add_argument("--token", metavar="TOKEN", help="bearer token (better: FABRICD_TOKEN in the environment)")
    p.add_argument("--data-dir", type=Path, metavar="DIR", help="folder for the spool (default ./data)")
    p.add_argument("--metrics-listen", metavar="HOST:PORT", help="also serve this agent's /metrics here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fabricd.agent.main import run_agent
    from fabricd.settings import AgentSettings

    settings = settings_or_exit(
        AgentSettings,
        args,
        central=args.central,
        node=args.node,
        sysfs_root=args.sysfs_root,
        interval_seconds=args.interval_seconds,
        token=args.token,
        data_dir=args.data_dir,
        metrics_listen=args.metrics_listen,
    )
    sysfs_root_or_exit(settings.sysfs_root)
    return run_agent(settings)
