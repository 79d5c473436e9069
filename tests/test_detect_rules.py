"""Rules load from YAML, and a bad rule is reported with its file and key before detection starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricd.detect.rules import RULES_DIR, RuleError, load_rules
from fabricd.detect.signals import SIGNALS
from fabricd.model import IncidentKind


def test_shipped_rules_load_and_cover_every_incident_kind() -> None:
    rules = load_rules(signals=SIGNALS)
    assert {r.kind for r in rules.rules} == set(IncidentKind)
    assert all(r.signal in SIGNALS for r in rules.rules)
    assert rules.lifecycle.quiet_seconds > 0


def test_every_shipped_rule_explains_its_threshold_in_a_comment() -> None:
    for path in sorted(RULES_DIR.glob("*.yaml")):
        text = path.read_text()
        for block in text.split("  - name: ")[1:]:
            assert "#" in block, f"{path.name}: rule {block.split()[0]} has no comment giving its reasoning"


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (
            "rules:\n  - {name: a, kind: congestion, signal: ecn_marked_ratio, condition: 'about 5'}\n",
            "rules[0].condition",
        ),
        ("rules:\n  - {name: a, kind: congestion, signal: nope, condition: '> 1'}\n", "rules[0].signal"),
        ("rules:\n  - {name: a, kind: slowness, signal: ecn_marked_ratio, condition: '> 1'}\n", "rules[0].kind"),
        (
            "rules:\n  - {name: a, kind: congestion, signal: ecn_marked_ratio, condition: '> 1', for: soon}\n",
            "rules[0].for",
        ),
        (
            "rules:\n  - {name: a, kind: congestion, signal: ecn_marked_ratio, condition: '> 1', tresh: 2}\n",
            "rules[0].tresh",
        ),
        ("rules:\n  - {name: a, kind: congestion, signal: ecn_marked_ratio}\n", "rules[0].condition"),
        ("lifecycle: {quiet: never}\n", "lifecycle.quiet"),
        ("lifecycle: {flap_count: 0}\n", "lifecycle.flap_count"),
        ("rule: []\n", "rule"),
    ],
)
def test_a_bad_rule_names_its_file_and_key(tmp_path: Path, body: str, key: str) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(body)
    with pytest.raises(RuleError) as err:
        load_rules([path], SIGNALS)
    assert str(err.value).startswith(f"mine.yaml: {key}:"), str(err.value)


def test_duplicate_rule_names_across_files_are_rejected(tmp_path: Path) -> None:
    rule = "rules:\n  - {name: same, kind: congestion, signal: ecn_marked_ratio, condition: '> 1%'}\n"
    (tmp_path / "a.yaml").write_text(rule)
    (tmp_path / "b.yaml").write_text(rule)
    with pytest.raises(RuleError, match=r"b.yaml: rules\[0\].name: duplicate rule name 'same' \(also in a.yaml\)"):
        load_rules([tmp_path], SIGNALS)


def test_percent_conditions_and_durations_are_normalized(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(
        "rules:\n  - {name: a, kind: congestion, signal: ecn_marked_ratio, condition: '>= 5%', clear: '< 1%',"
        " window: 1m, for: 30s, severity: critical}\n"
    )
    (rule,) = load_rules([tmp_path], SIGNALS).rules
    assert (rule.condition.op, rule.condition.threshold) == (">=", 0.05)
    assert (rule.window_seconds, rule.for_seconds) == (60.0, 30.0)
    assert rule.still_holds(0.02) and not rule.still_holds(0.005)
