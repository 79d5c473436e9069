"""The ``fabricd`` command: one module per subcommand group, registered in ``COMMAND_MODULES``.

Each module exposes ``register(subparsers)``, which adds its subcommands and sets
``func(args) -> int`` on them. Modules import heavy dependencies inside ``func`` so that
``fabricd --help`` stays fast and a missing optional dependency breaks one command, not all.
Settings are built inside ``func`` (never at import). A command whose optional part is not
installed (``pip install fabricd`` is the agent alone) says which extra to install and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence

from fabricd import __version__
from fabricd.extras import MissingExtra, extra_for

COMMAND_MODULES: tuple[str, ...] = (
    "fabricd.cli.server",
    "fabricd.cli.agent",
    "fabricd.cli.collect",
    "fabricd.cli.demo",
    "fabricd.cli.model",
    "fabricd.cli.parse",
    "fabricd.hooks.cli",
    "fabricd.cli.oncall",
    "fabricd.cli.topology",
    "fabricd.cli.jobs",
    "fabricd.cli.report",
    "fabricd.cli.token",
    "fabricd.cli.sim",
    "fabricd.cli.config",
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


# Flags whose value is a time, often relative ("-2h"). argparse takes a value that starts with "-"
# and is not a plain negative number for an option ("expected one argument"), so ``--since -2h``
# is joined into ``--since=-2h`` before parsing, which argparse reads as intended.
TIME_FLAGS = frozenset({"--since", "--until"})
_RELATIVE = re.compile(r"^-\d+(\.\d+)?[a-z]+$")


def join_relative_times(argv: Sequence[str]) -> list[str]:
    """``[..., "--since", "-2h", ...]`` -> ``[..., "--since=-2h", ...]`` (other arguments untouched)."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in TIME_FLAGS and _RELATIVE.match(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(join_relative_times(sys.argv[1:] if argv is None else argv))
    try:
        return int(args.func(args) or 0)
    except MissingExtra as exc:
        print(exc, file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        extra = extra_for(exc)
        if extra is None:
            raise
        print(MissingExtra(extra, f"fabricd {args.command}", exc.name or "?"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `fabricd collect ... | head`: the reader went away; that is not an error.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
