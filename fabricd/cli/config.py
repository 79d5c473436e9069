"""``fabricd config``: the annotated example settings, the reference, and a check of a settings file.

    fabricd config example agent > /etc/fabricd/agent.yaml    # every key at its default, explained
    fabricd config reference                                  # docs/configuration.md, as Markdown
    fabricd config check agent -c /etc/fabricd/agent.yaml     # validate file + environment, exit 2 if bad

What a pip-installed node needs, since ``deploy/config/`` ships with the checkout, not the wheel.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fabricd.cli.common import add_config_option

KINDS = ("agent", "server")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "config",
        help="print example settings or the settings reference; check a settings file",
        description="Print the annotated example settings of the agent or the central service, the "
        "settings reference (docs/configuration.md), or check a settings file with the environment.",
    )
    csub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    example = csub.add_parser("example", help="print an example settings file with every key explained")
    example.add_argument("kind", choices=KINDS)
    csub.add_parser("reference", help="print the settings reference (Markdown)")
    check = csub.add_parser(
        "check", help="validate a settings file and FABRICD_* variables as the command would at start"
    )
    check.add_argument("kind", choices=KINDS)
    add_config_option(check)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fabricd import settingsdoc
    from fabricd.settings import AgentSettings, ServerSettings, SettingsError, load

    model = AgentSettings if getattr(args, "kind", "agent") == "agent" else ServerSettings
    if args.config_command == "example":
        sys.stdout.write(settingsdoc.example(model))
        return 0
    if args.config_command == "reference":
        sys.stdout.write(settingsdoc.reference())
        return 0
    try:
        load(model, args.config)
    except SettingsError as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 2
    print(f"{args.config or 'environment'}: valid {args.kind} settings")
    return 0
