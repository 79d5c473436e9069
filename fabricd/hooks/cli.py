"""``fabricd hooks list|test``: check the hooks in a server config without waiting for an incident."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from fabricd.cli.common import add_config_option, settings_or_exit


def register(sub: Any) -> None:
    p = sub.add_parser(
        "hooks",
        help="list or test the alert hooks of a server config",
        description="List the alert hooks configured in a server settings file, or send "
        "each a test notification (exit status 1 if any delivery failed).",
    )
    hsub = p.add_subparsers(dest="hooks_command", metavar="ACTION", required=True)
    actions = (
        ("list", "print the configured hooks", "Print the hooks configured in the settings file (validated)."),
        ("test", "send a test notification", "Send a test notification through each hook and print the outcome."),
    )
    for name, helptext, description in actions:
        q = hsub.add_parser(name, help=helptext, description=description)
        add_config_option(q)
        if name == "test":
            q.add_argument("--name", help="test only this hook (default: all)")
        q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fabricd.hooks import HookConfigError, HookDispatcher
    from fabricd.settings import ServerSettings

    settings = settings_or_exit(ServerSettings, args)
    try:
        dispatcher = HookDispatcher.from_settings(settings)
    except HookConfigError as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 2
    if not dispatcher.hooks:
        where = f"in {args.config}" if args.config else "(no settings file: pass -c server.yaml)"
        print(f"fabricd: no alert hooks configured {where}; add a 'hooks:' list (docs/prometheus.md)", file=sys.stderr)
        return 0 if args.hooks_command == "list" else 1
    if args.hooks_command == "list":
        for name, hook in dispatcher.hooks.items():
            print(f"{name}\t{hook.cfg.kind}\t{hook.cfg.url}")
        return 0
    if args.name is not None and args.name not in dispatcher.hooks:
        print(f"fabricd: no hook named {args.name!r}", file=sys.stderr)
        return 2
    outcomes = asyncio.run(_test(dispatcher, args.name))
    for name, outcome in outcomes.items():
        print(f"{name}\t{outcome}")
    return 0 if all(o == "delivered" for o in outcomes.values()) else 1


async def _test(dispatcher: Any, name: str | None) -> dict[str, str]:
    try:
        return dict(await dispatcher.send_test(name))
    finally:
        await dispatcher.stop(drain_seconds=0)
