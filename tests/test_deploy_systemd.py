"""deploy/systemd: the units checked by systemd itself, the user by systemd-sysusers, the env files by fabricd.

``systemd-analyze verify`` loads each unit as systemd would (unknown keys, bad values, a missing
ExecStart binary are reported); its ExecStart points at this checkout's ``fabricd`` for the check.
``systemd-analyze security --offline`` scores the sandboxing. No systemd runs as PID 1 here, so the
units are not started; the agent and server they start are tested everywhere else.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fabricd import settingsdoc
from fabricd.cli import build_parser
from fabricd.settings import AgentSettings, ServerSettings, load
from tests.helpers import REPO, need_binary

SYSTEMD = REPO / "deploy" / "systemd"
UNITS = ("fabricd-agent.service", "fabricd-server.service")
INSTALLED = "/opt/fabricd/bin/fabricd"


def _unit_dir(tmp_path: Path, edit: str = "") -> Path:
    """The units (and the capture drop-in) with ExecStart at this checkout's fabricd."""
    here = Path(sys.executable).with_name("fabricd")
    out = tmp_path / "units"
    (out / "fabricd-agent.service.d").mkdir(parents=True)
    for name in UNITS:
        text = (SYSTEMD / name).read_text().replace(INSTALLED, str(here))
        (out / name).write_text(text + edit)
    shutil.copy(SYSTEMD / "drop-ins" / "capture.conf", out / "fabricd-agent.service.d" / "capture.conf")
    return out


def _analyze(units: Path, *args: str) -> subprocess.CompletedProcess[str]:
    tool = need_binary("systemd-analyze")
    env = dict(os.environ, SYSTEMD_UNIT_PATH=f"{units}:", SYSTEMD_LOG_COLOR="0")
    return subprocess.run([tool, *args], capture_output=True, text=True, env=env, timeout=60, cwd=units)


def test_systemd_verify_accepts_both_units_and_the_drop_in_without_a_warning(tmp_path: Path) -> None:
    units = _unit_dir(tmp_path)
    proc = _analyze(units, "verify", *UNITS)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_systemd_verify_would_catch_a_typo(tmp_path: Path) -> None:
    units = _unit_dir(tmp_path, edit="ProtectSysstem=strict\n")  # appended to [Install]
    proc = _analyze(units, "verify", UNITS[0])
    assert "Unknown key 'ProtectSysstem' in section [Install]" in proc.stderr


def _exposure(units: Path, unit: str) -> float:
    proc = _analyze(units, "security", "--offline=yes", unit)
    match = re.search(rf"Overall exposure level for {re.escape(unit)}: ([0-9.]+) (\w+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    return float(match.group(1))


def test_the_sandbox_scores_ok_with_systemd_analyze_security(tmp_path: Path) -> None:
    units = _unit_dir(tmp_path)
    # systemd rates <= 3.9 "OK" (10 = unprotected). The agent keeps /sys, netlink and packet sockets.
    assert _exposure(units, "fabricd-server.service") <= 2.0
    assert _exposure(units, "fabricd-agent.service") <= 2.5


def _settings_of(unit: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize("unit", UNITS)
def test_each_unit_runs_as_the_dedicated_user_hardened_logging_to_the_journal(unit: str) -> None:
    s = _settings_of(SYSTEMD / unit)
    for key, value in {
        "User": "fabricd",
        "Group": "fabricd",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "StandardOutput": "journal",
        "StandardError": "journal",
        "AmbientCapabilities": "",
        "RestartPreventExitStatus": "2",
    }.items():
        assert s[key] == [value], key
    name = unit.removesuffix(".service").removeprefix("fabricd-")
    assert s["EnvironmentFile"] == [f"-/etc/fabricd/{name}.env"]
    argv = s["ExecStart"][0].split()
    assert argv[0] == INSTALLED and build_parser().parse_args(argv[1:]).command == name


def test_capabilities_are_only_what_a_collector_needs() -> None:
    agent, server = (_settings_of(SYSTEMD / u) for u in UNITS)
    assert server["CapabilityBoundingSet"] == [""]  # none at all
    assert agent["CapabilityBoundingSet"] == ["CAP_NET_RAW"]  # the most the capture drop-in may add
    drop_in = _settings_of(SYSTEMD / "drop-ins" / "capture.conf")
    assert drop_in == {"AmbientCapabilities": ["CAP_NET_RAW"]}
    text = (SYSTEMD / "fabricd-agent.service").read_text()
    for collector in ("infiniband", "ethtool", "netlink", "nccl", "pingmesh", "ibfabric", "capture"):
        assert re.search(rf"^#   {collector} ", text, re.M), f"the unit does not say what {collector} needs"


def test_sysusers_creates_the_fabricd_user_and_group(tmp_path: Path) -> None:
    tool = need_binary("systemd-sysusers")
    proc = subprocess.run(
        [tool, f"--root={tmp_path}", "--dry-run", str(SYSTEMD / "fabricd.sysusers")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout + proc.stderr
    assert re.search(r"Creating group '?fabricd'? with GID \d+", said)
    assert re.search(r"Creating user '?fabricd'? \(fabricd fabric telemetry\) with UID \d+", said)


def _env_file(path: Path) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return {k: v for k, v in pairs}


@pytest.mark.parametrize("model,name", [(AgentSettings, "agent"), (ServerSettings, "server")])
def test_env_files_hold_only_real_settings_and_load_with_the_example_config(
    model: type[AgentSettings] | type[ServerSettings], name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = _env_file(SYSTEMD / f"{name}.env")
    known = {s.env for s in settingsdoc.settings(model)}
    assert env and set(env) <= known, f"unknown variables: {sorted(set(env) - known)}"
    for key, value in env.items():
        if key in {"FABRICD_TRANSPORT__CA_FILE", "FABRICD_TLS_CERTFILE", "FABRICD_TLS_KEYFILE"}:
            continue  # files that exist on the real host only; paths are checked at start
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FABRICD_DATA_DIR", str(tmp_path))
    settings = load(model, REPO / "deploy" / "config" / f"{name}.yaml")
    for key, value in env.items():
        if key.startswith("FABRICD_TLS") or key.endswith("CA_FILE"):
            continue
        path = key.removeprefix("FABRICD_").lower().split("__")
        got = settings
        for part in path:
            got = getattr(got, part)
        assert str(got) == value, key
