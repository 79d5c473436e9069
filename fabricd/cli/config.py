"""``fabricd config``: the annotated example settings, the reference, and a check of a settings file.

    fabricd config example agent > /etc/fabricd/agent.yaml    # every key at its default, explained
    fabricd config reference                                  # docs/configuration.md, as Markdown
    fabricd config check agent -c /etc/fabricd/agent.yaml     # validate file + environment, exit 2 if bad

What a pip-installed node needs, since ``deploy/config/`` ships with the checkout, not the wheel.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
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
    example = csub.add_parser(
        "example",
        help="print an example settings file with every key explained",
        description="Print a settings file with every key at its default, each with its meaning, "
        "environment variable and flag (as deploy/config/ in the checkout).",
    )
    example.add_argument(
        "kind", choices=KINDS, metavar="KIND", help="agent (fabricd agent, collect) or server (fabricd server)"
    )
    reference = csub.add_parser(
        "reference",
        help="print the settings reference (Markdown)",
        description="Print every setting with its type, default, environment variable, flag and "
        "meaning, as docs/configuration.md.",
    )
    check = csub.add_parser(
        "check",
        help="validate a settings file and FABRICD_* variables as the command would at start",
        description="Load a settings file and the FABRICD_* environment as the agent or the server does "
        "at start; exit 2 with the bad key named, 0 when valid.",
    )
    check.add_argument("kind", choices=KINDS, metavar="KIND", help="which settings the file holds: agent or server")
    add_config_option(check)
    for q in (example, reference):
        q.add_argument("-o", "--output", type=Path, metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fabricd import settingsdoc
    from fabricd.settings import AgentSettings, ServerSettings, SettingsError, load

    model = AgentSettings if getattr(args, "kind", "agent") == "agent" else ServerSettings
    if args.config_command in ("example", "reference"):
        text = settingsdoc.example(model) if args.config_command == "example" else settingsdoc.reference()
        if args.output is None:
            sys.stdout.write(text)
        else:
            args.output.write_text(text)
        return 0
    try:
        load(model, args.config)
    except SettingsError as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        return 2
    print(f"{args.config or 'environment'}: valid {args.kind} settings")
    return 0
