"""The ``fabricd`` command: one module per subcommand group, registered in ``COMMAND_MODULES``.

Each module exposes ``register(subparsers)``, which adds its subcommands and sets
``func(args) -> int`` on them. Modules import heavy dependencies inside ``func`` so that
``fabricd --help`` stays fast and a missing optional dependency breaks one command, not all.
Settings are built inside ``func`` (never at import).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from fabricd import __version__

COMMAND_MODULES: tuple[str, ...] = (
    "fabricd.cli.server",
    "fabricd.cli.agent",
    "fabricd.cli.collect",
    "fabricd.cli.demo",
    "fabricd.cli.model",
    "fabricd.hooks.cli",
    "fabricd.cli.oncall",
    "fabricd.cli.report",
    "fabricd.cli.token",
    "fabricd.cli.sim",
)

EPILOG = """\
quick start:  make demo   (central + simulated cluster on this machine)
docs:         README.md, docs/
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fabricd",
        description="Network-fabric telemetry and diagnostics for AI clusters (InfiniBand / RoCE).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fabricd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `fabricd collect ... | head`: the reader went away; that is not an error.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
