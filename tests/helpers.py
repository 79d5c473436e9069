"""Helpers shared by tests (import as ``from tests.helpers import need_binary``).

Strict CI: under ``CI=true`` a skipped test is a failure (the brief's rule), so a test that needs a
binary, root or PostgreSQL calls ``need_binary``/``need_root``/... which skip on a laptop with a reason
and fail loudly in CI, where ``.ci/run`` installs everything.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.lab import Lab

REPO = Path(__file__).resolve().parent.parent
CASES = REPO / "tests" / "cases"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _skip_or_fail(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true forbids skips: {reason}", pytrace=False)
    pytest.skip(reason)


def need_binary(name: str) -> str:
    """Path of ``name`` on PATH (or /usr/bin, /usr/sbin); skip off-CI, fail in CI when missing."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if path is None:
        _skip_or_fail(f"{name} is not installed (.ci/run installs it)")
        raise AssertionError("unreachable")
    return path


def need_root() -> None:
    if os.geteuid() != 0:
        _skip_or_fail("needs root (network namespaces, raw sockets)")


def skip_or_fail(reason: str) -> None:
    _skip_or_fail(reason)


def built_lab(hosts: Sequence[str], prefix: str) -> Iterator[Lab]:
    """The netns lab for a test: needs root and iproute2; torn down (and checked gone) afterwards."""
    from tests.support.lab import Lab, stale_namespaces

    need_root()
    for tool in ("ip", "tc", "bridge"):
        need_binary(tool)
    with Lab(hosts, prefix=prefix) as built:
        yield built
    assert stale_namespaces(prefix) == []
