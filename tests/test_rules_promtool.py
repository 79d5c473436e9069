"""Prometheus rules: ``promtool check rules`` clean, ``promtool test rules`` green, and every metric a
rule reads is in the catalogue (so a renamed metric breaks this test, not a 3 a.m. page)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from fabricd.catalogue import lookup
from tests.helpers import REPO, need_binary

pytestmark = [pytest.mark.binaries]

RULES = REPO / "rules" / "prometheus"
RULE_FILES = sorted(RULES.glob("*.yml"))
TEST_FILES = sorted((RULES / "tests").glob("*_test.yml"))
METRIC = re.compile(r"(?<![:\w])fabricd_[a-z0-9_]*[a-z0-9](?![:\w(])")
NAME_REGEX = re.compile(r'__name__=~"([^"]+)"')


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=RULES)


def rules() -> list[dict[str, str]]:
    return [rule for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for rule in g["rules"]]


def test_promtool_check_rules_is_clean() -> None:
    result = run([need_binary("promtool"), "check", "rules", *map(str, RULE_FILES)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


@pytest.mark.parametrize("test_file", TEST_FILES, ids=[p.name for p in TEST_FILES])
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    result = run([need_binary("promtool"), "test", "rules", str(test_file)])
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_every_rule_file_has_unit_tests_for_every_alert() -> None:
    tested = {
        t.get("alertname")
        for f in TEST_FILES
        for case in yaml.safe_load(f.read_text())["tests"]
        for t in case.get("alert_rule_test", [])
    }
    alerts = {r["alert"] for r in rules() if "alert" in r}
    untested = alerts - tested
    assert not untested, f"alerts without a promtool test: {sorted(untested)}"


def test_rules_read_only_catalogued_metrics() -> None:
    for rule in rules():
        expr = rule["expr"]
        for name in METRIC.findall(expr):
            assert lookup(name) is not None and not lookup(name).pattern, f"{rule}: {name} is not catalogued"  # type: ignore[union-attr]
        for regex in NAME_REGEX.findall(expr):
            prefix, alternatives, suffix = re.fullmatch(r"([^(]*)\(([^)]*)\)(.*)", regex).groups()  # type: ignore[union-attr]
            for alt in alternatives.split("|"):
                assert lookup(prefix + alt + suffix) is not None, f"{rule['alert' if 'alert' in rule else 'record']}"
