"""deploy/kubernetes: every manifest validated against the Kubernetes OpenAPI schemas (kubernetes-validate,
strict: an unknown field fails), the ServiceMonitor against the Prometheus Operator's CRD schema,
and the cross-references a typo would break (selectors, ports, Secrets, ConfigMap keys) checked.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from fabricd import settingsdoc
from fabricd.settings import AgentSettings, ServerSettings, load
from tests.helpers import REPO

K8S = REPO / "deploy" / "kubernetes"
CRD = REPO / "tests" / "fixtures" / "crds" / "monitoring.coreos.com_servicemonitors.yaml"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
# The oldest Kubernetes still commonly run and the newest kubernetes-validate knows.
VERSIONS = ("1.28.0", "1.37.0")


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _all() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for p in MANIFESTS for d in _docs(p)}


@pytest.mark.parametrize("version", VERSIONS)
def test_kubernetes_validate_passes_every_builtin_manifest_strictly(version: str) -> None:
    tool = Path(sys.executable).with_name("kubernetes-validate")
    builtin = [p for p in MANIFESTS if p.name != "servicemonitor.yaml"]
    proc = subprocess.run(
        [str(tool), "--strict", "-k", version, *map(str, builtin)], capture_output=True, text=True, timeout=300
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    passed = re.findall(r"^INFO (\S+) passed for resource (\S+) against version", out, re.M)
    assert len(passed) == sum(len(_docs(p)) for p in builtin)
    assert "WARN" not in out and "ERROR" not in out


def test_kubernetes_validate_would_catch_a_misspelt_field(tmp_path: Path) -> None:
    tool = Path(sys.executable).with_name("kubernetes-validate")
    bad = tmp_path / "ds.yaml"
    bad.write_text((K8S / "agent-daemonset.yaml").read_text().replace("hostNetwork:", "hostNetwrok:"))
    proc = subprocess.run([str(tool), "--strict", str(bad)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "hostNetwrok" in proc.stdout + proc.stderr


def _crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]


def _unknown_fields(obj: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Fields the API server would silently prune (structural schema, no preserve-unknown-fields)."""
    if isinstance(obj, dict) and "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out = [f"{where}.{k}" for k in obj if k not in schema["properties"]]
        return out + [
            x
            for k, v in obj.items()
            if k in schema["properties"]
            for x in _unknown_fields(v, schema["properties"][k], f"{where}.{k}")
        ]
    if isinstance(obj, list) and "items" in schema:
        return [x for i, v in enumerate(obj) for x in _unknown_fields(v, schema["items"], f"{where}[{i}]")]
    return []


def test_the_servicemonitor_is_valid_against_the_prometheus_operator_crd() -> None:
    (monitor,) = _docs(K8S / "servicemonitor.yaml")
    schema = _crd_schema()
    jsonschema.validate(monitor, schema)
    assert _unknown_fields(monitor, schema) == []
    broken = {**monitor, "spec": {**monitor["spec"], "endpoints": [{"port": "http", "scrapeTimout": "10s"}]}}
    assert _unknown_fields(broken, schema) == [".spec.endpoints[0].scrapeTimout"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**monitor, "spec": {**monitor["spec"], "endpoints": [{"interval": "15 s"}]}}, schema)


def test_the_kustomization_lists_every_manifest_but_the_optional_postgresql_secret() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in MANIFESTS if p.name != "postgresql-secret.yaml")


def _pod(kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = _all()[(kind, name)]["spec"]["template"]
    return spec


def test_the_agent_daemonset_runs_on_gpu_nodes_on_the_host_network_reading_sys_read_only() -> None:
    pod = _pod("DaemonSet", "fabricd-agent")
    spec = pod["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    (agent,) = spec["containers"]
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["sys"]["hostPath"]["path"] == "/sys" and mounts["sys"] == {
        "name": "sys",
        "mountPath": "/host/sys",
        "readOnly": True,
    }
    assert "hostPath" in volumes["spool"]  # the spool outlives the pod across a rolling upgrade
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["runAsUser"] == 9470 and spec["securityContext"]["runAsNonRoot"] is True
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9471"


def _mib(quantity: str) -> float:
    number, unit = re.fullmatch(r"([0-9.]+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return float(number) * (1024 if unit == "Gi" else 1)


def _millicores(quantity: str) -> float:
    return float(quantity[:-1]) if quantity.endswith("m") else float(quantity) * 1000


def test_the_agent_resources_follow_the_benchmarks() -> None:
    bench = (REPO / "docs" / "benchmarks.md").read_text()
    rss = float(re.search(r"fabricd agent peak RSS \| ([0-9.]+) MiB", bench).group(1))  # type: ignore[union-attr]
    cpu = float(re.search(r"fabricd agent steady CPU at 1 s interval \| ([0-9.]+) %", bench).group(1))  # type: ignore[union-attr]
    (agent,) = _pod("DaemonSet", "fabricd-agent")["spec"]["containers"]
    res = agent["resources"]
    assert _mib(res["requests"]["memory"]) >= rss and _mib(res["limits"]["memory"]) >= 4 * rss
    # The request covers the steady state at a 1 s interval (10x the default rate) with room.
    assert _millicores(res["requests"]["cpu"]) >= 2 * cpu * 10
    assert _millicores(res["limits"]["cpu"]) >= 500  # start-up imports take about a core-second


def test_services_probes_secrets_and_config_keys_refer_to_things_that_exist() -> None:
    objs = _all()
    service = objs[("Service", "fabricd-central")]
    pod = _pod("Deployment", "fabricd-central")
    labels = pod["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (central,) = pod["spec"]["containers"]
    ports = {p["name"] for p in central["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    assert central["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    monitor = objs[("ServiceMonitor", "fabricd-central")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    config = objs[("ConfigMap", "fabricd-config")]["data"]
    for kind, name in (("DaemonSet", "fabricd-agent"), ("Deployment", "fabricd-central")):
        for container in _pod(kind, name)["spec"]["containers"]:
            for mount in container["volumeMounts"]:
                if "subPath" in mount:
                    assert mount["subPath"] in config
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    assert ref["key"] in objs[("Secret", ref["name"])]["stringData"]
    pg = objs[("Secret", "fabricd-database")]["stringData"]["url"]
    assert pg.startswith("postgresql+psycopg://")


def test_the_configmap_settings_load_and_every_variable_is_a_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = _all()[("ConfigMap", "fabricd-config")]["data"]
    for model, key in ((AgentSettings, "agent.yaml"), (ServerSettings, "server.yaml")):
        path = tmp_path / key
        path.write_text(data[key])
        loaded = load(model, path)
        assert loaded.log_format == "json"
    known = {s.env for m in (AgentSettings, ServerSettings) for s in settingsdoc.settings(m)}
    for kind, name in (("DaemonSet", "fabricd-agent"), ("Deployment", "fabricd-central")):
        for container in _pod(kind, name)["spec"]["containers"]:
            names = {e["name"] for e in container.get("env", [])}
            assert names <= known, f"{name}: {sorted(names - known)} are not fabricd settings"
    assert load(AgentSettings, tmp_path / "agent.yaml").sysfs_root == Path("/host/sys")
