"""docs/configuration.md and the example deploy/config/{agent,server}.yaml, generated from the settings.

    python -m fabricd.settingsdoc            # rewrite them (from the repository root)
    fabricd config example agent|server      # print an example (what a pip-installed node has)
    python -m fabricd.settingsdoc --check    # exit 1 when they are stale (tests/test_configuration.py)

Every setting's type, default and meaning come from the models in ``fabricd/settings.py``
(``Field(description=...)``), its environment variable from the settings' prefix and nesting
delimiter, and its flag from the ``fabricd`` argument parser (a flag whose ``dest`` is the
setting's name), so the reference cannot drift from the code.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fabricd.settings import AgentSettings, ServerSettings, _Base
from fabricd.settings_base import Strict as _Strict

ENV_PREFIX, ENV_DELIMITER = "FABRICD_", "__"
# Settings model -> the commands that read it (their flags are listed with the setting).
COMMANDS: dict[type[_Base], tuple[str, ...]] = {
    AgentSettings: ("agent", "collect"),
    ServerSettings: ("server", "token", "hooks"),
}
# Defaults that depend on the machine are described, not printed.
MACHINE_DEFAULTS = {("node",): "the hostname"}
OUTPUTS = {
    "docs/configuration.md": lambda: reference(),
    "deploy/config/agent.yaml": lambda: example(AgentSettings),
    "deploy/config/server.yaml": lambda: example(ServerSettings),
}


@dataclass(frozen=True)
class Setting:
    path: tuple[str, ...]
    field: FieldInfo
    nested: bool  # a section (spool, transport, limits) rather than a value

    @property
    def key(self) -> str:
        return ".".join(self.path)

    @property
    def env(self) -> str:
        return ENV_PREFIX + ENV_DELIMITER.join(p.upper() for p in self.path)

    @property
    def description(self) -> str:
        return self.field.description or ""


def settings(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[Setting]:
    """Every setting of ``model`` in declaration order, sections followed by their settings."""
    for name, field in model.model_fields.items():
        section = _section(field.annotation)
        yield Setting((*prefix, name), field, section is not None)
        if section is not None:
            yield from settings(section, (*prefix, name))


def _section(annotation: Any) -> type[_Strict] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, _Strict) else None


def default(setting: Setting) -> Any:
    field = setting.field
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return None if field.default is PydanticUndefined else field.default


def type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (types.UnionType, typing.Union):
        inner = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(inner) + (" (optional)" if type(None) in args else "")
    if origin is dict:
        return "mapping"
    if origin is list:
        return "list"
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def flags(model: type[_Base]) -> dict[str, list[str]]:
    """Setting name -> the flags that set it, per command (``agent --central``)."""
    from fabricd.cli import build_parser

    # (setting, command, flag) -> the command's actions that take it: "token create|revoke|list --db"
    found: dict[tuple[str, str, str], list[str]] = {}
    top = _subcommands(build_parser())
    for command in COMMANDS[model]:
        parser = top[command]
        leaves = _subcommands(parser) or {"": parser}
        for action_name, leaf in leaves.items():
            for action in leaf._actions:
                if action.dest in model.model_fields and action.option_strings:
                    flag = max(action.option_strings, key=len)
                    found.setdefault((action.dest, command, flag), []).append(action_name)
    out: dict[str, list[str]] = {}
    for (dest, command, flag), actions in found.items():
        verbs = "|".join(a for a in actions if a)
        out.setdefault(dest, []).append(" ".join(p for p in (command, verbs, flag) if p))
    return out


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _shown_default(setting: Setting) -> str:
    if setting.path in MACHINE_DEFAULTS:
        return MACHINE_DEFAULTS[setting.path]
    value = default(setting)
    if setting.nested:
        return ""
    if value is None:
        return "unset"
    return f"`{_yaml_value(value)}`"


def _yaml_value(value: Any) -> str:
    if isinstance(value, Path):
        value = str(value)
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()


def reference() -> str:
    """docs/configuration.md."""
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m fabricd.settingsdoc` from fabricd/settings.py (and settings_delivery.py); "
        "tests/test_configuration.py fails when it is stale. Do not edit by hand. -->",
        "",
        "Settings come from a YAML or TOML file (`-c FILE`), then `FABRICD_*` environment variables "
        "(nested keys joined with `__`), then flags: each overrides the one before. Everything is "
        "validated at start and a bad value stops the program with a message that names the key. "
        "Annotated examples with every key: `deploy/config/agent.yaml`, `deploy/config/server.yaml`.",
        "",
    ]
    for model, title in ((AgentSettings, "Agent"), (ServerSettings, "Central service")):
        commands = ", ".join(f"`fabricd {c}`" for c in COMMANDS[model])
        by_flag = flags(model)
        out += [f"## {title} ({commands})", ""]
        out += ["| setting | type | default | environment | flag | meaning |", "|---|---|---|---|---|---|"]
        for s in settings(model):
            shown = "section" if s.nested else type_name(s.field.annotation)
            flag = "<br>".join(f"`{f}`".replace("|", "\\|") for f in by_flag.get(s.key, [])) or "-"
            meaning = s.description.replace("|", "\\|").replace("<", "&lt;")
            out.append(f"| `{s.key}` | {shown} | {_shown_default(s)} | `{s.env}` | {flag} | {meaning} |")
        out.append("")
    return "\n".join(out)


def example(model: type[_Base]) -> str:
    """An example settings file with every key at its default, each with its meaning, env var and flag."""
    name = "agent" if model is AgentSettings else "server"
    by_flag = flags(model)
    out = [
        f"# fabricd {name} settings: every key at its default, with what it means (`fabricd config",
        f"# example {name}` prints this; generated from fabricd/settings.py; reference: docs/configuration.md).",
        "# Keep the keys you change and delete the rest. FABRICD_* environment variables and flags",
        f"# override this file: fabricd {name} -c {name}.yaml",
    ]
    for s in settings(model):
        indent = "  " * (len(s.path) - 1)
        where = [s.env, *by_flag.get(s.key, [])]
        out.append("")
        out += [f"{indent}# {line}" for line in textwrap.wrap(s.description, 96 - len(indent))]
        out.append(f"{indent}# ({', '.join(where)})")
        out.append(_example_line(s, indent))
    return "\n".join(out) + "\n"


def _example_line(setting: Setting, indent: str) -> str:
    key = setting.path[-1]
    if setting.nested:
        return f"{indent}{key}:"
    if setting.path in MACHINE_DEFAULTS:
        return f"{indent}# {key}: <{MACHINE_DEFAULTS[setting.path]}>"
    value = default(setting)
    return f"{indent}{key}:" + ("" if value is None else f" {_yaml_value(value)}")


def stale(root: Path) -> list[str]:
    return [rel for rel, make in OUTPUTS.items() if _read(root / rel) != make()]


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fabricd.settingsdoc", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: here)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    args = parser.parse_args(argv)
    if args.check:
        old = stale(args.root)
        for rel in old:
            print(f"{rel} is stale: run python -m fabricd.settingsdoc", file=sys.stderr)
        return 1 if old else 0
    for rel, make in OUTPUTS.items():
        (args.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (args.root / rel).write_text(make())
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
