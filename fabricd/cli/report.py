"""``fabricd report``: an incident or time-range report (HTML with embedded PNG plots) from the REST API.

    fabricd report --incident 42 --out /tmp/inc42          # report.html + the PNGs
    fabricd report --since -2h --until -1h --png-only      # the PNGs alone

Exit codes as the on-call commands (fabricd/cli/oncall.py): 0 ok, 1 the server answered with an
error (unknown incident, unauthorized), 2 usage, 3 cannot reach the server.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fabricd.cli import oncall


def register(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="write an incident or time-range report: HTML with rate plots, pingmesh, NCCL vs model",
        description="Gather an incident (or every incident of a time range) from the central service and "
        "write report.html (plots embedded) and the plots as PNG files. See docs/report.md.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--incident", type=int, metavar="ID", help="report on this incident")
    what.add_argument("--since", metavar="TIME", help="report on a time range from TIME (RFC 3339 or -2h)")
    p.add_argument("--until", metavar="TIME", help="end of the time range (default now)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("fabricd-report"),
        metavar="DIR",
        help="output folder (default ./fabricd-report)",
    )
    p.add_argument("--png-only", action="store_true", help="write the PNG plots only, no report.html")
    p.add_argument("--pad", default="10m", metavar="DURATION", help="context around an incident (default 10m)")
    p.add_argument("--top", type=int, default=10, metavar="N", help="rows of the hottest-ports table (default 10)")
    p.add_argument("--max-ports", type=int, default=6, metavar="N", help="implicated ports plotted (default 6)")
    _model_options(p)
    p.add_argument(
        "--server",
        default=os.environ.get("FABRICD_SERVER", oncall.DEFAULT_SERVER),
        help=f"central service URL (env FABRICD_SERVER, default {oncall.DEFAULT_SERVER})",
    )
    p.add_argument("--token", default=os.environ.get("FABRICD_TOKEN", ""), help="read token (env FABRICD_TOKEN)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each server answer")
    p.set_defaults(func=run)


def _model_options(p: argparse.ArgumentParser) -> None:
    """The fabric the NCCL results are compared against (flags as ``fabricd model``)."""
    g = p.add_argument_group("performance model (NCCL section; see fabricd model --help)")
    g.add_argument("--topology", type=Path, metavar="FILE", help="YAML with a 'topology' mapping (a scenario works)")
    g.add_argument(
        "--link-rate", metavar="RATE", help="per-HCA link rate, e.g. 400G (default: each node's own, from its sysfs)"
    )
    g.add_argument(
        "--hcas-per-node", type=int, metavar="N", help="network ports per node (default: each node's own active ports)"
    )
    g.add_argument(
        "--gpus-per-node", type=int, metavar="N", help="ranks per node (default: as each NCCL-tests run reports it)"
    )
    g.add_argument("--nodes-per-leaf", type=int, metavar="N", help="nodes under one leaf (default 16)")
    g.add_argument("--oversubscription", type=float, metavar="X", help="leaf down:up capacity ratio (default 1)")
    g.add_argument("--alpha-us", type=float, metavar="US", help="per-step latency, microseconds (default 8)")
    g.add_argument("--efficiency", type=float, metavar="F", help="achievable fraction of line rate (default 0.9)")
    g.add_argument(
        "--nccl-nodes",
        type=int,
        default=2,
        metavar="N",
        help="nodes in one NCCL-tests job when a run does not say (default 2)",
    )


def build_query(args: argparse.Namespace, now: float) -> Any:
    """The ``ReportQuery`` the flags describe; ``ValueError`` names the bad flag."""
    from fabricd.cli.model import build_fabric
    from fabricd.report import ReportQuery
    from fabricd.timeparse import parse_duration, parse_time

    fabric = build_fabric(argparse.Namespace(**{"sysfs_root": None, "nvlink": None, **vars(args)}))
    return ReportQuery(
        incident_id=args.incident,
        since=_flag("--since", args.since, lambda v: parse_time(v, now)),
        until=_flag("--until", args.until, lambda v: parse_time(v, now)),
        pad_seconds=_flag("--pad", args.pad, parse_duration),
        top=args.top,
        max_ports=args.max_ports,
        fabric=fabric,
        nccl_nodes=args.nccl_nodes,
        hardware="flags" if hardware_flags(args) else "nodes",
    )


def hardware_flags(args: argparse.Namespace) -> bool:
    """Did the user describe the nodes' hardware? Then it replaces what each node's sysfs said."""
    return bool(args.topology) or any(v is not None for v in (args.link_rate, args.hcas_per_node, args.gpus_per_node))


def _flag(flag: str, value: str | None, parse: Callable[[str], float]) -> Any:
    if value is None:
        return None
    try:
        return parse(value)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    from fabricd.extras import require

    require("report", "fabricd report")
    from fabricd.progress import progress
    from fabricd.report import STEPS, RestSource, build_report, write_report

    now = time.time()
    try:
        query = build_query(args, now)
    except (ValueError, OSError) as exc:
        print(f"fabricd report: {exc}", file=sys.stderr)
        return oncall.EXIT_USAGE
    client = oncall.CLIENT_FACTORY(args.server, args.token, args.timeout)
    try:
        with progress("report", total=STEPS) as step:
            report = build_report(RestSource(client), query, now, step)
    except oncall.Unreachable as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return oncall.EXIT_UNREACHABLE
    except oncall.ServerError as exc:
        print(f"fabricd: server said {exc.status} {exc.code}: {exc.message}", file=sys.stderr)
        return oncall.EXIT_SERVER
    finally:
        client.close()
    for path in write_report(report, args.out, args.png_only):
        print(path)
    return oncall.EXIT_OK
