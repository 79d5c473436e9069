"""deploy/install-system-deps.sh installs every system tool a test asks for (``need_binary``).

Each name passed to ``need_binary`` in tests/ is resolved on this machine and mapped to the Debian
package that owns it (``dpkg -S``); that package must be in the script's list, or be essential or
of priority required (on every Debian install: coreutils, mount), so a fresh CI machine has it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from tests.helpers import REPO, need_binary

SCRIPT = REPO / "deploy" / "install-system-deps.sh"


def _listed() -> set[str]:
    match = re.search(r"^pkgs=\(([^)]*)\)", SCRIPT.read_text(), re.M)
    assert match, "no pkgs=(...) list in install-system-deps.sh"
    return set(match.group(1).split())


def _asked_for() -> set[str]:
    names = set()
    for test in (REPO / "tests").rglob("*.py"):
        names |= set(re.findall(r'need_binary\("([^"]+)"\)', test.read_text()))
        for group in re.findall(r"for tool in \(([^)]*)\):\s*\n\s*need_binary\(tool\)", test.read_text()):
            names |= set(re.findall(r'"([^"]+)"', group))
    return names


def _owner(path: str) -> tuple[str, bool]:
    """(package, always installed) of ``path``."""
    dpkg = need_binary("dpkg-query")
    for candidate in {path, str(Path(path).resolve()), "/usr" + path if not path.startswith("/usr") else path[4:]}:
        proc = subprocess.run([dpkg, "-S", candidate], capture_output=True, text=True)
        if proc.returncode == 0:
            # "diversion by dash from: /bin/sh" lines come first; the owner is "dash: /bin/sh".
            owners = [line for line in proc.stdout.splitlines() if not line.startswith("diversion ")]
            package = owners[-1].split(":", 1)[0].split(",")[0].strip()
            fields = subprocess.run(
                [dpkg, "-W", "-f=${Essential} ${Priority}", package], capture_output=True, text=True
            ).stdout.split()
            return package, "yes" in fields or "required" in fields
    raise AssertionError(f"{path} belongs to no Debian package")


def test_every_binary_a_test_needs_comes_from_a_package_the_script_installs() -> None:
    asked = _asked_for()
    assert {"promtool", "systemd-analyze", "amtool", "ip"} <= asked  # the scan finds them
    listed = _listed()
    missing = {}
    for name in sorted(asked):
        path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
        assert path is not None, f"{name} is not installed here"
        package, essential = _owner(path)
        if package not in listed and not essential:
            missing[name] = package
    assert missing == {}, f"add these packages to {SCRIPT.name}: {missing}"
