"""deploy/container: the Containerfile linted by hadolint, the compose file validated against the
Compose Specification, its Prometheus and Alertmanager configs by promtool and amtool.

No container engine runs here (the docker CLI alone), so the image is not built in the tests; what
can be checked without one is checked by the tools that own each format, and every host path the
compose file mounts must exist in the checkout.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from fabricd import settingsdoc
from fabricd.settings import AgentSettings, ServerSettings
from tests.helpers import REPO, need_binary

CONTAINER = REPO / "deploy" / "container"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    return str(path) if path.exists() else need_binary(name)


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_tool("hadolint"), "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_hadolint_finds_nothing_in_the_containerfile() -> None:
    proc = _hadolint(CONTAINER / "Containerfile")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_hadolint_would_catch_a_careless_line(tmp_path: Path) -> None:
    bad = tmp_path / "Containerfile"
    bad.write_text((CONTAINER / "Containerfile").read_text() + "RUN pip install requests\n")
    proc = _hadolint(bad)
    assert proc.returncode == 1 and "DL3013" in proc.stdout


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n\s*", " ", text)
    lines = [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def test_the_image_is_multi_stage_non_root_with_a_healthcheck_for_agent_and_server() -> None:
    steps = _instructions((CONTAINER / "Containerfile").read_text())
    froms = [arg for op, arg in steps if op == "FROM"]
    assert len(froms) == 2 and froms[0].endswith("AS build")
    final = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM") :]
    users = [arg for op, arg in final if op == "USER"]
    assert users == ["9470:9470"]  # numeric: Kubernetes runAsNonRoot can check it
    assert [arg for op, arg in final if op == "ENTRYPOINT"] == ['["fabricd"]']
    assert [arg for op, arg in final if op == "CMD"] == ['["server", "-c", "/etc/fabricd/server.yaml"]']
    health = [arg for op, arg in final if op == "HEALTHCHECK"]
    assert len(health) == 1 and "FABRICD_HEALTH_URL" in health[0]
    # Everything the build copies exists in the checkout.
    for op, arg in steps:
        if op == "COPY" and "--from" not in arg:
            for source in arg.split()[:-1]:
                assert (REPO / source).exists(), source


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((CONTAINER / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _compose_spec_check(path: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema with the Compose Specification schema it ships (no network)."""
    return subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_compose_file_is_valid_against_the_compose_specification() -> None:
    proc = _compose_spec_check(CONTAINER / "compose.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "ok -- validation done"


def test_the_compose_schema_check_would_catch_a_mistake(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yaml"
    bad.write_text((CONTAINER / "compose.yaml").read_text().replace("network_mode: host", "network_mode: [host]"))
    proc = _compose_spec_check(bad)
    assert proc.returncode == 1 and "network_mode" in proc.stdout


def test_the_stack_has_the_central_prometheus_grafana_alertmanager_and_a_host_agent() -> None:
    services = _compose()["services"]
    assert sorted(services) == ["agent", "alertmanager", "central", "grafana", "prometheus"]
    agent = services["agent"]
    assert agent["network_mode"] == "host"
    assert "/sys:/host/sys:ro" in agent["volumes"]
    assert agent["environment"]["FABRICD_SYSFS_ROOT"] == "/host/sys"
    assert services["central"]["image"] == agent["image"]  # one image, two commands
    assert services["central"]["command"][0] == "server" and agent["command"][0] == "agent"
    grafana = " ".join(services["grafana"]["volumes"])
    assert "../../grafana/provisioning/datasources:/etc/grafana/provisioning/datasources" in grafana
    datasource = yaml.safe_load((REPO / "grafana/provisioning/datasources/fabricd.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"  # the compose service


def test_every_host_path_the_compose_file_mounts_exists() -> None:
    for name, service in _compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/")) and not source.startswith("/sys"):
                assert (CONTAINER / source).resolve().exists(), f"{name}: {source}"
    mounted = (CONTAINER / "../../grafana/dashboards").resolve()
    assert list(mounted.glob("*.json")), "no dashboards to provision"


def test_fabricd_variables_in_the_compose_file_are_real_settings() -> None:
    known = {s.env for m in (AgentSettings, ServerSettings) for s in settingsdoc.settings(m)}
    known.add("FABRICD_HEALTH_URL")  # the image's HEALTHCHECK, not a setting
    for name, service in _compose()["services"].items():
        for key in service.get("environment", {}):
            if key.startswith("FABRICD_"):
                assert key in known, f"{name}: {key} is not a fabricd setting"


def test_promtool_and_amtool_accept_the_stacks_prometheus_and_alertmanager_configs(tmp_path: Path) -> None:
    # As mounted in compose.yaml: rules/prometheus/*.yml next to prometheus.yml under rules/.
    shutil.copy(CONTAINER / "prometheus.yml", tmp_path / "prometheus.yml")
    (tmp_path / "rules").mkdir()
    for rule in (REPO / "rules" / "prometheus").glob("*.yml"):
        shutil.copy(rule, tmp_path / "rules" / rule.name)
    prom = subprocess.run(
        [need_binary("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert prom.returncode == 0, prom.stdout + prom.stderr
    assert re.search(r"SUCCESS: [1-9]\d* rule files found", prom.stdout)
    am = subprocess.run(
        [need_binary("amtool"), "check-config", str(CONTAINER / "alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert am.returncode == 0 and "SUCCESS" in am.stdout, am.stdout + am.stderr
