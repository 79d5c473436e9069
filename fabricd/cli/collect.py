"""``fabricd collect``: run the collectors locally and print what they read.

What an engineer runs on a node to see what the agent sees, and what the benchmarks time.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

from fabricd.cli.common import add_config_option, settings_or_exit, sysfs_root_or_exit


def register(sub: Any) -> None:
    p = sub.add_parser(
        "collect",
        help="run the collectors locally and print their readings",
        description="Run the configured collectors on this node and print what they read "
        "(one object per reading: source, device, port, counter, value, unit, rate, status). "
        "With --count > 1 the second and later scrapes carry rates.",
    )
    add_config_option(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--once", action="store_true", help="scrape once and exit (the default)")
    g.add_argument("--count", type=int, metavar="N", help="scrape N times")
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between scrapes with --count (0 = back to back; default 1)",
    )
    p.add_argument(
        "--format",
        choices=["json", "prometheus", "none"],
        default="json",
        help="json: a JSON array per scrape; prometheus: exposition text; none: print nothing",
    )
    p.add_argument("--sysfs-root", type=Path, metavar="DIR", help="sysfs mount to read (default /sys)")
    p.add_argument(
        "--collector",
        action="append",
        metavar="NAME",
        help="run only this collector (repeatable; default: those in the config, else infiniband)",
    )
    p.add_argument("--node", help="node name to label readings with (default: hostname)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fabricd.settings import AgentSettings

    if args.count is not None and args.count < 1:
        print("fabricd: --count must be at least 1", file=sys.stderr)
        return 2
    if args.interval < 0:
        print("fabricd: --interval must be >= 0", file=sys.stderr)
        return 2
    settings = settings_or_exit(AgentSettings, args, sysfs_root=args.sysfs_root, node=args.node)
    sysfs_root_or_exit(settings.sysfs_root)
    return asyncio.run(_collect(settings, args))


def _configured(settings: Any, only: list[str] | None) -> dict[str, Any]:
    from collectors import DEFAULT_COLLECTORS

    configured = dict(settings.collectors) or {name: {} for name in DEFAULT_COLLECTORS}
    if only:
        return {name: configured.get(name, {}) for name in only}
    return configured


async def _collect(settings: Any, args: argparse.Namespace) -> int:
    from collectors import REGISTRY
    from fabricd.agent.runtime import CollectorRunner
    from fabricd.collector import CollectorConfigError, build_collectors
    from fabricd.pipeline import ScrapePipeline

    try:
        collectors = build_collectors(
            _configured(settings, args.collector), node=settings.node, sysfs_root=settings.sysfs_root, registry=REGISTRY
        )
    except CollectorConfigError as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 2
    runner = CollectorRunner(collectors, settings.collector_timeout_seconds)
    pipeline = ScrapePipeline()
    failed = False
    out = sys.stdout.buffer
    # What exists now (imports, settings, collectors) outlives the loop: freezing it keeps the
    # cyclic GC from walking it again at every full collection (~6% of a scrape,
    # docs/counters.md "Performance"). Unfrozen afterwards, for callers that go on.
    gc.freeze()
    try:
        for i in range(args.count or 1):
            if i:
                await asyncio.sleep(args.interval)
            result = await runner.scrape(time.time())
            samples = pipeline.samples(result.ts, result.readings)
            failed = failed or not all(h.success for h in result.health)
            _print(out, args.format, samples, result.health)
    finally:
        gc.unfreeze()
        await runner.close()
    return 1 if failed else 0


def _print(out: Any, fmt: str, samples: list[Any], health: list[Any]) -> None:
    for h in health:
        if not h.success:
            print(f"fabricd: collector {h.collector} failed: {h.error}", file=sys.stderr)
    if fmt == "json":
        out.write(json.dumps([s.to_json() for s in samples], separators=(",", ":")).encode() + b"\n")
    elif fmt == "prometheus":
        from fabricd.exposition import render

        out.write(render(samples))
    out.flush()
