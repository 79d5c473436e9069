"""docs/configuration.md and deploy/config/*.yaml: generated from the settings, current, complete, loadable."""

from __future__ import annotations

import difflib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabricd import settingsdoc
from fabricd.settings import AgentSettings, ServerSettings, _Base, load
from tests.helpers import REPO

MODELS = [(AgentSettings, "agent"), (ServerSettings, "server")]


def test_the_generated_files_are_current() -> None:
    for rel, make in settingsdoc.OUTPUTS.items():
        on_disk = (REPO / rel).read_text()
        diff = "".join(difflib.unified_diff(on_disk.splitlines(True), make().splitlines(True), rel, "generated"))
        assert diff == "", f"{rel} is stale; run python -m fabricd.settingsdoc\n{diff}"


def test_the_check_command_fails_on_a_stale_file(tmp_path: Path) -> None:
    for rel in settingsdoc.OUTPUTS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel).read_text())
    check = [sys.executable, "-m", "fabricd.settingsdoc", "--check", "--root", str(tmp_path)]
    assert subprocess.run(check, capture_output=True, text=True).returncode == 0
    doc = tmp_path / "docs" / "configuration.md"
    doc.write_text(doc.read_text().replace("| `central` |", "| `centrall` |"))
    stale = subprocess.run(check, capture_output=True, text=True)
    assert (stale.returncode, stale.stderr) == (
        1,
        "docs/configuration.md is stale: run python -m fabricd.settingsdoc\n",
    )


def _keys(model: type[Any]) -> list[str]:
    return [s.key for s in settingsdoc.settings(model)]


@pytest.mark.parametrize("model", [AgentSettings, ServerSettings])
def test_every_setting_has_a_row_with_its_meaning_env_var_and_type(model: type[_Base]) -> None:
    doc = (REPO / "docs" / "configuration.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in doc.splitlines() if line.startswith("| `")}
    for s in settingsdoc.settings(model):
        assert s.description, f"{s.key} has no description in fabricd/settings.py"
        row = rows[s.key]
        assert f"`{s.env}`" in row and s.description.replace("|", "\\|").replace("<", "&lt;") in row


def test_rows_give_exact_types_defaults_and_flags() -> None:
    doc = (REPO / "docs" / "configuration.md").read_text()
    cells = [re.split(r"(?<!\\)\|", line) for line in doc.splitlines() if line.startswith("| `")]
    rows = {c[1].strip(" `"): [x.strip() for x in c[2:6]] for c in cells}
    assert rows["interval_seconds"] == ["number", "`10.0`", "`FABRICD_INTERVAL_SECONDS`", "`agent --interval`"]
    assert rows["spool.max_bytes"] == ["integer", "`268435456`", "`FABRICD_SPOOL__MAX_BYTES`", "-"]
    assert rows["transport.wire_version"][:3] == ["integer", "`3`", "`FABRICD_TRANSPORT__WIRE_VERSION`"]
    assert rows["node"][:2] == ["string", "the hostname"]
    assert rows["auth"][3] == "`server --no-auth`"
    assert rows["db"][3] == "`server --db`<br>`token create\\|revoke\\|list --db`"
    assert rows["log_format"][0] == "one of `logfmt`, `json`"


def _flat(data: dict[str, Any], sections: set[str], prefix: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        out.append(prefix + key)
        if prefix + key in sections:
            out += _flat(value or {}, sections, f"{prefix}{key}.")
    return out


@pytest.mark.parametrize("model,name", MODELS)
def test_the_example_loads_to_the_defaults_and_has_every_key(model: type[_Base], name: str) -> None:
    path = REPO / "deploy" / "config" / f"{name}.yaml"
    loaded = load(model, path)
    assert loaded.model_dump(exclude={"node"}) == model().model_dump(exclude={"node"})
    sections = {s.key for s in settingsdoc.settings(model) if s.nested}
    present = _flat(yaml.safe_load(path.read_text()), sections)
    machine = {".".join(p) for p in settingsdoc.MACHINE_DEFAULTS if ".".join(p) in _keys(model)}
    assert sorted(present) == sorted(set(_keys(model)) - machine)
    text = path.read_text()
    for key in machine:  # described, commented out: the machine decides
        assert f"\n# {key}: <" in text
    # each key is preceded by its meaning and where else it can be set
    for s in settingsdoc.settings(model):
        assert f"# ({s.env}" in text


def test_the_token_can_come_from_a_file_and_a_bad_one_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fabricd.settings import SettingsError

    secret = tmp_path / "agent.token"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("FABRICD_TOKEN_FILE", str(secret))
    assert load(AgentSettings).token == "s3cret"
    with pytest.raises(SettingsError, match=r"^invalid settings: token_file: set token or token_file, not both$"):
        load(AgentSettings, overrides={"token": "x"})
    secret.write_text("\n")
    with pytest.raises(SettingsError, match=rf"^invalid settings: token_file: {secret} is empty$"):
        load(AgentSettings)
    monkeypatch.setenv("FABRICD_TOKEN_FILE", str(tmp_path / "nope"))
    with pytest.raises(SettingsError, match=r"token_file: cannot read .*/nope: No such file or directory$"):
        load(AgentSettings)


def _fabricd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabricd", *args], capture_output=True, text=True, timeout=60)


def test_fabricd_config_prints_the_examples_and_the_reference_and_checks_a_file(tmp_path: Path) -> None:
    for name in ("agent", "server"):
        shown = _fabricd("config", "example", name)
        assert (shown.returncode, shown.stdout) == (0, (REPO / "deploy" / "config" / f"{name}.yaml").read_text())
        checked = _fabricd("config", "check", name, "-c", str(REPO / "deploy" / "config" / f"{name}.yaml"))
        assert (checked.returncode, checked.stdout) == (0, f"{REPO}/deploy/config/{name}.yaml: valid {name} settings\n")
    reference = _fabricd("config", "reference")
    assert (reference.returncode, reference.stdout) == (0, (REPO / "docs" / "configuration.md").read_text())
    written = _fabricd("config", "example", "server", "-o", str(tmp_path / "server.yaml"))
    assert written.returncode == 0 and load(ServerSettings, tmp_path / "server.yaml") == ServerSettings()
    bad = tmp_path / "agent.yaml"
    bad.write_text("interval_seconds: -1\n")
    refused = _fabricd("config", "check", "agent", "-c", str(bad))
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (
        f"fabricd: {bad} (or FABRICD_* environment): invalid settings: interval_seconds: "
        "Input should be greater than or equal to 0\n"
    )
