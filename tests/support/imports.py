"""Which product modules nothing but the tests (or the benchmarks) reaches.

A module ships in the wheel to serve a user: it must be reachable from what a user runs. The roots
are the console scripts of ``pyproject.toml``, ``python -m fabricd`` and the Alembic migrations
(Alembic loads them by path from ``fabricd/server/db.py``'s ``MIGRATIONS``). From there the walk
follows every import statement, inside functions too (grimp's graph, the one import-linter checks),
and every string literal that names a module, which is how fabricd loads code lazily
(``collectors.REGISTRY``'s ``"collectors.infiniband:InfinibandCollector"``, ``fabricd.cli``'s
``COMMAND_MODULES``, ``python -m fabricd.sim.standin``), and a package that loads every module of
its own with ``fabricd.drivers.discover`` (the driver tables) imports them all. What the walk never
reaches and the tests
import is a test harness in the product: it belongs in ``tests/support/``.

    python -m tests.support.imports [ROOT]     # prints {module: [its importers]} as JSON
"""

from __future__ import annotations

import ast
import json
import sys
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path

import grimp

PRODUCT = ("fabricd", "collectors")
MIGRATIONS = "fabricd.server.migrations"


def module_file(root: Path, module: str) -> Path:
    base = root.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def entry_points(root: Path, modules: Iterable[str]) -> set[str]:
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    roots = {target.partition(":")[0] for target in scripts.values()} | {"fabricd.__main__"}
    return roots | {m for m in modules if m.startswith(MIGRATIONS)}


def named_modules(source: str, known: set[str]) -> Iterator[str]:
    """Modules a file names in a string literal: ``"pkg.mod"``, ``"pkg.mod:Attr"``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value.partition(":")[0]
            if name in known:
                yield name


def _with_packages(modules: Iterable[str]) -> set[str]:
    """Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` too."""
    out = set()
    for module in modules:
        parts = module.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def unreachable(root: Path) -> dict[str, list[str]]:
    """Product modules that no entry point reaches, each with the modules that import it."""
    graph = grimp.build_graph(*PRODUCT, "tests", include_external_packages=False, cache_dir=None)
    product = {m for m in graph.modules if m.split(".")[0] in PRODUCT}
    for module in product:
        source = module_file(root, module).read_text()
        for named in named_modules(source, product):
            if named != module:
                graph.add_import(importer=module, imported=named)
        if "discover(__name__, __path__" in source:  # pkgutil: every module of the package is loaded
            for child in graph.find_children(module):
                graph.add_import(importer=module, imported=child)
    reached = set()
    for start in entry_points(root, product):
        reached |= {start} | graph.find_upstream_modules(start)
    missing = product - _with_packages(reached)
    return {m: sorted(graph.find_modules_that_directly_import(m)) for m in sorted(missing)}


if __name__ == "__main__":
    print(json.dumps(unreachable(Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()), indent=1))
