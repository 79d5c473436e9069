"""The command frame: every subcommand prints useful --help; settings errors name the bad key."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from fabricd.cli import build_parser
from fabricd.settings import AgentSettings, ServerSettings, SettingsError, load, parse_listen


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    return _children(build_parser())


def _all_commands() -> dict[str, argparse.ArgumentParser]:
    """Every command path, nested groups included: 'token create', 'token list', ..."""
    out: dict[str, argparse.ArgumentParser] = {}
    todo = list(_subcommands().items())
    while todo:
        path, parser = todo.pop()
        out[path] = parser
        todo.extend((f"{path} {name}", child) for name, child in _children(parser).items())
    return out


def test_top_level_help_lists_every_subcommand() -> None:
    out = subprocess.run([sys.executable, "-m", "fabricd", "--help"], capture_output=True, text=True, check=True)
    for name in _subcommands():
        assert f"\n    {name}" in out.stdout, name


@pytest.mark.parametrize("path", sorted(_all_commands()))
def test_each_subcommand_help_describes_real_options(path: str, capsys: pytest.CaptureFixture[str]) -> None:
    sub = _all_commands()[path]
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*path.split(), "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert sub.description, f"fabricd {path} has no description"
    documented = [a for a in sub._actions if a.help and a.help != argparse.SUPPRESS and a.dest != "help"]
    assert documented or _children(sub), f"fabricd {path} has no documented options or arguments"
    undocumented = [
        a.dest
        for a in sub._actions
        if not a.help and a.dest != "help" and not isinstance(a, argparse._SubParsersAction)
    ]
    assert not undocumented, f"fabricd {path}: options without help: {undocumented}"
    for action in documented:
        flag = action.option_strings[-1] if action.option_strings else (action.metavar or action.dest)
        assert str(flag) in text, f"{flag} missing from fabricd {path} --help"


def test_bad_config_key_exits_2_naming_key_and_file(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("interval_seconds: -5\nspool:\n  max_bytes: lots\n")
    proc = subprocess.run(
        [sys.executable, "-m", "fabricd", "collect", "--config", str(cfg)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert str(cfg) in proc.stderr
    assert "interval_seconds" in proc.stderr and "spool.max_bytes" in proc.stderr


def test_precedence_file_then_environment_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('node = "from-file"\ninterval_seconds = 3\n[spool]\nmax_bytes = 100\n')
    s = load(AgentSettings, cfg)
    assert (s.node, s.interval_seconds, s.spool.max_bytes) == ("from-file", 3, 100)
    monkeypatch.setenv("FABRICD_INTERVAL_SECONDS", "7")
    monkeypatch.setenv("FABRICD_SPOOL__MAX_BYTES", "200")
    s = load(AgentSettings, cfg)
    assert (s.node, s.interval_seconds, s.spool.max_bytes) == ("from-file", 7, 200)
    s = load(AgentSettings, cfg, {"node": "from-flag", "interval_seconds": None})
    assert (s.node, s.interval_seconds) == ("from-flag", 7)


def test_unreadable_and_malformed_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read config file"):
        load(ServerSettings, tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: [unclosed\n")
    with pytest.raises(SettingsError, match=r"bad\.yaml:2:1: not valid YAML: while parsing a flow sequence"):
        load(ServerSettings, bad)
    bad.write_text("listen: nowhere\n")
    with pytest.raises(SettingsError, match="listen"):
        load(ServerSettings, bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- a\n- b\n")
    with pytest.raises(SettingsError, match="top level must be a mapping"):
        load(ServerSettings, lst)


def test_defaults_match_the_documented_ones() -> None:
    s = ServerSettings()
    assert s.listen == "127.0.0.1:9470"
    assert s.database_url() == "sqlite:///data/fabricd.db"
    a = AgentSettings()
    assert a.sysfs_root == Path("/sys") and a.central == "http://127.0.0.1:9470"
    assert parse_listen("[::1]:9470") == ("::1", 9470)
    with pytest.raises(ValueError):
        parse_listen("9470")
