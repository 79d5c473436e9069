"""Options and helpers shared by several subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TypeVar

from fabricd import logs
from fabricd.settings import SettingsError, _Base, load

S = TypeVar("S", bound=_Base)


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c",
        "--config",
        type=Path,
        metavar="FILE",
        help="settings file (YAML or TOML); FABRICD_* environment variables and flags override it",
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=None,
        help="log level (default: info, or log_level in the config file)",
    )


def settings_or_exit(cls: type[S], args: argparse.Namespace, **overrides: Any) -> S:
    """Build settings in main(); on a bad key print the message (it names the key) and exit 2."""
    try:
        settings = load(cls, getattr(args, "config", None), {"log_level": args.log_level, **overrides})
    except SettingsError as exc:
        print(f"fabricd: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    logs.setup(settings.log_level, settings.log_format)
    return settings


def sysfs_root_or_exit(root: Path) -> None:
    """A sysfs root that is not a folder is a typo: refuse at start (exit 2) rather than read nothing."""
    if not root.is_dir():
        print(f"fabricd: sysfs_root: {root} is not a directory (--sysfs-root, FABRICD_SYSFS_ROOT)", file=sys.stderr)
        raise SystemExit(2)
