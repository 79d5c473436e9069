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
            for name in names_of(regex):
                assert lookup(name) is not None, f"{rule['alert' if 'alert' in rule else 'record']}: {name}"


def names_of(regex: str) -> list[str]:
    """The names a ``__name__`` regex of the form ``a_(x|y)_b|c_(z)_d`` matches."""
    out = []
    for branch in re.split(r"\|(?![^(]*\))", regex):  # top-level alternatives
        prefix, alternatives, suffix = re.fullmatch(r"([^(]*)\(([^)]*)\)(.*)", branch).groups()  # type: ignore[union-attr]
        out += [prefix + alt + suffix for alt in alternatives.split("|")]
    return out


# Alert -> (the PromQL the alert compares with a number, the signal it carries, the incident rule of
# rules/detection/ on that signal): the two thresholds must be the same number. The PromQL reads the
# agent's copy of the signal (fabricd_derived_<signal>, the same function: fabricd/signal_table.py),
# or a recording rule (RECORDED_TOTALS) or window over it.
SAME_THRESHOLD: dict[str, list[tuple[str, str, str]]] = {
    "FabricdEcnCongestion": [("fabricd_derived_ecn_marked_ratio", "ecn_marked_ratio", "ecn_marked")],
    "FabricdXmitWaitCongestion": [("fabricd_derived_xmit_wait_ratio", "xmit_wait_ratio", "xmit_wait")],
    "FabricdPortDiscards": [("node_device_port:fabricd_discards:per_second", "discards_per_second", "discards")],
    "FabricdRdmaRetransmissions": [
        ("node_device_port:fabricd_sequence_errors:per_second", "sequence_errors_per_second", "sequence_errors"),
        ("node_device_port:fabricd_retransmits:per_second", "retransmits_per_second", "retransmits"),
    ],
    "FabricdLinkErrors": [
        ("node_device_port:fabricd_phy_errors:per_second[5m])", "phy_errors_per_second", "phy_errors")
    ],
    "FabricdPauseFraction": [("node_device:fabricd_rx_pause:max_ratio", "rx_pause_ratio", "paused_victim")],
    "FabricdPfcStorm": [
        (
            "node_device:fabricd_pause_storm_events:per_second[5m])",
            "pause_storm_events_per_second",
            "pause_storm_events",
        ),
        ("(fabricd_derived_tx_pause_ratio)", "tx_pause_ratio", "pause_storm_tx"),
    ],
    "FabricdProbeLoss": [("node_peer:fabricd_pingmesh_loss:ratio5m", "probe_loss_ratio", "probe_loss")],
}


def test_alerts_use_the_incident_rules_thresholds_on_the_same_signals() -> None:
    from fabricd.detect.rules import load_rules
    from fabricd.detect.signals import SIGNALS

    incident = {r.name: r for r in load_rules(None, SIGNALS).rules}
    alerts = {r["alert"]: r for r in rules() if "alert" in r}
    for alert, pairs in SAME_THRESHOLD.items():
        expr = " ".join(alerts[alert]["expr"].split())
        for promql, signal, rule_name in pairs:
            found = re.search(re.escape(promql) + r" > ([0-9.]+)", expr)
            assert found, f"{alert}: no '{promql} > N' in {expr}"
            rule = incident[rule_name]
            assert rule.signal == signal, (alert, rule_name)
            assert (rule.condition.op, float(found.group(1))) == (">", rule.condition.threshold), (alert, rule_name)


def test_saturation_alert_watches_exactly_the_counters_a_signal_reads() -> None:
    # FabricdCounterSaturated must not fire for the narrow counters no signal reads (a 4-bit
    # excessive_buffer_overrun_errors sits saturated for years on healthy hosts) and must fire for
    # every saturating counter whose saturation blinds a signal.
    from fabricd import signal_table as table
    from fabricd.drivers.ib import pma

    read = {n for s in table.SIGNALS for slot in s.inputs for n in slot} | {*table.SENT_BYTES, *table.RECEIVED_BYTES}
    can_saturate = [*pma.BASE, *(pma.legacy(c) for c in pma.DATA)]
    expected = {c.raw for c in can_saturate if c.saturates and c.name in read}
    expr = next(r["expr"] for r in rules() if r.get("alert") == "FabricdCounterSaturated")
    watched = re.search(r'counter=~"([^"]+)"', expr).group(1).split("|")  # type: ignore[union-attr]
    assert set(watched) == expected
    assert "excessive_buffer_overrun_errors" not in watched and "port_xmit_wait" in watched


# Recording rule -> the signal it records: a per-second total the agent does not export.
RECORDED_TOTALS = {
    "node_device_port:fabricd_phy_errors:per_second": "phy_errors_per_second",
    "node_device_port:fabricd_discards:per_second": "discards_per_second",
    "node_device_port:fabricd_sequence_errors:per_second": "sequence_errors_per_second",
    "node_device_port:fabricd_retransmits:per_second": "retransmits_per_second",
    "node_device:fabricd_pause_storm_events:per_second": "pause_storm_events_per_second",
}


def test_recorded_totals_add_up_the_inputs_the_detectors_add_up() -> None:
    from fabricd import signal_table as table

    recorded = {r["record"]: r["expr"] for r in rules() if "record" in r}
    for record, signal in RECORDED_TOTALS.items():
        spec = table.BY_NAME[signal]
        assert spec.compute is not None and not spec.agent, signal  # a total the agent does not export
        (regex,) = NAME_REGEX.findall(recorded[record])
        assert sorted(names_of(regex)) == sorted(table.rate_families(spec)), record
        assert recorded[record].lstrip().startswith("sum by ("), record
