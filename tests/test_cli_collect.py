"""`fabricd collect`: what an engineer runs on a node, and what the benchmarks time."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import CASES, need_binary

TREE = CASES / "infiniband" / "gpud-h100" / "sys"


def _collect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabricd", "collect", *args], capture_output=True, text=True, timeout=120
    )


def test_count_100_back_to_back_with_no_output_for_benchmarks() -> None:
    proc = _collect("--count", "100", "--interval", "0", "--format", "none", "--sysfs-root", str(TREE))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""


def test_json_scrapes_carry_rates_from_the_second_on(tmp_path: Path) -> None:
    tree = tmp_path / "sys"
    shutil.copytree(TREE, tree)
    proc = _collect("--count", "2", "--interval", "0.2", "--format", "json", "--sysfs-root", str(tree))
    assert proc.returncode == 0, proc.stderr
    first, second = (json.loads(line) for line in proc.stdout.splitlines())
    data = [r for r in first if r["counter"] == "port_xmit_data" and r["device"] == "mlx5_0"]
    assert data and data[0]["status"] == "first" and data[0]["rate"] is None
    assert data[0]["value"] == 4 * int((tree / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data").read_text())
    again = next(r for r in second if r["counter"] == "port_xmit_data" and r["device"] == "mlx5_0")
    assert again["status"] == "ok" and again["rate"] == 0.0  # a captured tree does not move
    for obj in first:
        assert {"source", "device", "port", "counter", "value", "unit"} <= obj.keys()


def test_prometheus_format_is_promtool_clean(tmp_path: Path) -> None:
    promtool = need_binary("promtool")
    proc = _collect("--once", "--format", "prometheus", "--sysfs-root", str(TREE))
    assert proc.returncode == 0, proc.stderr
    assert "fabricd_infiniband_port_transmit_data_bytes_total{" in proc.stdout
    check = subprocess.run([promtool, "check", "metrics"], input=proc.stdout, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_machine_without_infiniband_reports_no_devices_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "class" / "net").mkdir(parents=True)
    proc = _collect("--once", "--sysfs-root", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_usage_errors_exit_2_with_a_message() -> None:
    proc = _collect("--collector", "nosuch", "--sysfs-root", str(TREE))
    assert proc.returncode == 2 and "collectors.nosuch: unknown collector" in proc.stderr
    proc = _collect("--count", "0")
    assert proc.returncode == 2 and "--count must be at least 1" in proc.stderr
