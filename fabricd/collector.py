"""The collector seam: one method, ``async def collect(self) -> Sequence[Reading]``.

A collector is one module in ``collectors/``, one fixture folder in ``tests/cases/<name>/`` and one
line in ``collectors.REGISTRY``. It is built from a ``CollectorContext`` (roots, node name, its own
validated options, the sources of its side effects) and never reads a hard-coded ``/sys`` path or
global settings.

Side effects (sockets, netlink, the ethtool ioctl, subprocesses, clocks, the thread its blocking
reads run on) come from factories. Each collector that has any declares them as one small frozen
dataclass deriving from ``CollectorFactories``, whose defaults are what production uses, and asks
the context for it by type (``ctx.factories_for(NcclFactories)``). Tests and ``fabricd eval`` pass
their own instances to ``build``/``build_collectors``; mypy checks every field, and there is no
string key to misspell.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError

from fabricd.importer import ImportFromStringError, import_from_string
from fabricd.model import Reading


class CollectorOptions(BaseModel):
    """Base for a collector's own options (``collectors.<name>`` in the config file)."""

    model_config = ConfigDict(extra="forbid")


class CollectorFactories:
    """Base of a collector's side-effect factories: a frozen dataclass, production's by default."""


F = TypeVar("F", bound=CollectorFactories)


@dataclass(frozen=True)
class CollectorContext:
    """Everything a collector may know about its environment."""

    node: str
    sysfs_root: Path = Path("/sys")
    options: CollectorOptions = field(default_factory=CollectorOptions)
    # Sources of side effects given by tests and the simulator, at most one of each type; a
    # collector whose type is absent gets its production defaults.
    factories: Sequence[CollectorFactories] = ()

    def __post_init__(self) -> None:
        kinds = [type(f).__name__ for f in self.factories]
        twice = sorted({k for k in kinds if kinds.count(k) > 1})
        if twice:
            raise ValueError(f"factories given twice: {', '.join(twice)}")

    def factories_for(self, kind: type[F]) -> F:
        """The ``kind`` instance that was given, else ``kind()`` (the production defaults)."""
        for given in self.factories:
            if isinstance(given, kind):
                return given
        return kind()


@runtime_checkable
class Collector(Protocol):
    name: ClassVar[str]

    async def collect(self) -> Sequence[Reading]: ...


class CollectorConfigError(ValueError):
    """A collector's name or options are invalid; the message names the bad key."""


def options_model(cls: type) -> type[CollectorOptions]:
    model = getattr(cls, "Options", CollectorOptions)
    assert issubclass(model, CollectorOptions)
    return model


def resolve(name: str, registry: Mapping[str, str]) -> type:
    """Import the class registered as ``name`` (lazily: a missing optional dep disables one collector)."""
    if name not in registry:
        known = ", ".join(sorted(registry))
        raise CollectorConfigError(f"collectors.{name}: unknown collector (known: {known})")
    try:
        return import_from_string(registry[name])
    except ImportFromStringError as exc:
        raise CollectorConfigError(f"collectors.{name}: cannot load {registry[name]}: {exc}") from exc


def check_extra(name: str, cls: type) -> None:
    """A collector whose pip extra (``extra`` class attribute) is missing fails at start, by name."""
    from fabricd.extras import missing

    extra = getattr(cls, "extra", None)
    module = missing(extra) if extra else None
    if module is not None:
        raise CollectorConfigError(
            f"collectors.{name}: needs the '{extra}' extra (Python module {module!r} is not installed): "
            f"pip install 'fabricd[{extra}]'"
        )


def build(
    name: str,
    raw_options: Mapping[str, Any] | None,
    *,
    node: str,
    sysfs_root: Path,
    registry: Mapping[str, str],
    factories: Iterable[CollectorFactories] = (),
) -> Collector:
    """Validate ``raw_options`` against the collector's Options model and build it."""
    cls = resolve(name, registry)
    check_extra(name, cls)
    try:
        options = options_model(cls).model_validate(dict(raw_options or {}))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CollectorConfigError(f"collectors.{name}.{where}: {first['msg']}") from exc
    ctx = CollectorContext(node=node, sysfs_root=sysfs_root, options=options, factories=tuple(factories))
    collector = cls(ctx)
    assert isinstance(collector, Collector)
    return collector


def build_collectors(
    configured: Mapping[str, Mapping[str, Any] | None],
    *,
    node: str,
    sysfs_root: Path,
    registry: Mapping[str, str],
    factories: Iterable[CollectorFactories] = (),
) -> dict[str, Collector]:
    """Build every configured collector; raises CollectorConfigError naming the bad key."""
    given = tuple(factories)
    return {
        name: build(name, opts, node=node, sysfs_root=sysfs_root, registry=registry, factories=given)
        for name, opts in configured.items()
    }


async def close_collectors(collectors: Iterable[Collector]) -> None:
    """Call each collector's optional ``close`` (sync or async)."""
    for collector in collectors:
        closer = getattr(collector, "close", None)
        if closer is not None:
            result = closer()
            if asyncio.iscoroutine(result):
                await result
