"""``pip install fabricd`` is the agent alone: a fresh venv, the checkout installed without extras.

The package is built and installed as a user installs it (``pip install <checkout>``, build
isolation, dependencies resolved by pip), in a venv that does not see the test environment. Then:
FastAPI, SQLAlchemy, uvicorn, Alembic, matplotlib and scapy are absent; ``fabricd agent --help``
works; ``fabricd collect --once`` reads the procfs fixture exactly as the full install does; a real
agent scrapes and spools; commands that need an extra name it, exit 2, print no traceback.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import CASES, REPO
from tests.support.server import free_port

pytestmark = pytest.mark.slow

TREE = CASES / "infiniband" / "procfs" / "sys"
ABSENT = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "psycopg", "matplotlib", "scapy", "pytest")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("agent-only")
    src = root / "src"  # a copy: the build writes build/ and *.egg-info next to the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("fabricd", "collectors"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    install = subprocess.run(
        [str(env / "bin" / "pip"), "install", "--quiet", str(src)], capture_output=True, text=True, timeout=600
    )
    assert install.returncode == 0, install.stdout + install.stderr
    yield env


def run(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # cwd outside the checkout: a ``python -c`` there would import the checkout's fabricd instead.
    return subprocess.run([str(venv / "bin" / "fabricd"), *args], capture_output=True, text=True, timeout=60, cwd=venv)


def test_no_server_report_capture_or_test_dependency_is_installed(venv: Path) -> None:
    probe = "import importlib.util, sys; print([m for m in sys.argv[1:] if importlib.util.find_spec(m)])"
    found = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe, *ABSENT], capture_output=True, text=True, cwd=venv
    )
    assert found.stdout.strip() == "[]"
    requires = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m; print('\\n'.join(m.requires('fabricd')))",
        ],
        capture_output=True,
        text=True,
        cwd=venv,
    ).stdout.splitlines()
    runtime = sorted(re.split(r"[<>=!~;\[ ]", r)[0] for r in requires if "extra ==" not in r)
    agent = ["prometheus-client", "pyroute2", "pydantic", "pydantic-settings", "pyyaml", "httpx", "msgpack"]
    assert runtime == sorted([*agent, "rich", "hdrhistogram", "isal"])


def test_agent_help_and_collect_once_work_and_read_what_the_full_install_reads(venv: Path) -> None:
    helped = run(venv, "agent", "--help")
    assert helped.returncode == 0 and "--central URL" in helped.stdout
    alone = run(venv, "collect", "--once", "--sysfs-root", str(TREE))
    full = subprocess.run(
        [sys.executable, "-m", "fabricd", "collect", "--once", "--sysfs-root", str(TREE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert alone.returncode == full.returncode == 0, alone.stderr

    def readings(out: str) -> Counter[tuple[object, ...]]:
        keys = ("source", "device", "port", "counter", "name", "value", "unit", "kind")
        return Counter(tuple(str(r.get(k)) for k in keys) for r in json.loads(out))

    assert readings(alone.stdout) == readings(full.stdout)
    assert len(json.loads(alone.stdout)) == len(json.loads(full.stdout)) > 20


def test_the_agent_runs_scrapes_and_spools(venv: Path, tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # no central: everything goes to the spool
    args = ["agent", "--central", closed, "--node", "n1", "--sysfs-root", str(TREE), "--interval", "0.5"]
    agent = subprocess.Popen(
        [str(venv / "bin" / "fabricd"), *args, "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=venv,
    )
    try:
        deadline = time.monotonic() + 30
        while len(list((tmp_path / "spool").glob("*.batch"))) < 2:
            assert agent.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=30)
    assert agent.returncode == 0, out
    assert "Traceback" not in out and "central unreachable; spooling batches" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["server"],
            "fabricd server needs the 'server' extra (Python module 'fastapi' is not installed): "
            "pip install 'fabricd[server]'",
        ),
        (
            ["token", "list"],
            "fabricd token needs the 'server' extra (Python module 'fastapi' is not installed): "
            "pip install 'fabricd[server]'",
        ),
        (
            ["demo"],
            "fabricd demo (it runs the central service) needs the 'server' extra (Python module 'fastapi' "
            "is not installed): pip install 'fabricd[server]'",
        ),
        (
            ["report", "--since", "-2h"],
            "fabricd report needs the 'report' extra (Python module 'matplotlib' is "
            "not installed): pip install 'fabricd[report]'",
        ),
        (
            ["collect", "--once", "--collector", "capture", "--sysfs-root", str(TREE)],
            "fabricd: collectors.capture: "
            "needs the 'capture' extra (Python module 'scapy' is not installed): pip install 'fabricd[capture]'",
        ),
    ],
)
def test_a_command_that_needs_an_extra_names_it(venv: Path, args: list[str], message: str) -> None:
    proc = run(venv, *args)
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, message + "\n", "")


def test_the_installed_package_carries_the_detection_rules_and_scenarios(venv: Path) -> None:
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import fabricd, pathlib; print(pathlib.Path(fabricd.__file__).parent)"],
        capture_output=True,
        text=True,
        cwd=venv,
    ).stdout.strip()
    installed = Path(where)
    assert installed.is_relative_to(venv)
    rules = sorted(p.name for p in (installed / "rules" / "detection").glob("*.yaml"))
    assert rules == sorted(p.name for p in (REPO / "rules" / "detection").glob("*.yaml")) != []
    for rule in rules:
        assert (installed / "rules" / "detection" / rule).read_text() == (
            REPO / "rules" / "detection" / rule
        ).read_text()
    assert (installed / "sim" / "scenarios" / "demo.yaml").is_file()
