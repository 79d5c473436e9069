"""The store split by role (issue 21): each role talks to the database one way, each consumer imports
only the seams it uses, ingest knows nothing of detection, routes never see table models, and the
report package never imports the server. Checked on the source (an AST walk of the imports).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SERVER = REPO / "fabricd" / "server"
STORE = "fabricd.server.store"
SEAMS = {f"{STORE}.protocols", f"{STORE}.records"}


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a import b`` counts as ``a`` and ``a.b``), lazily or not."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def module(name: str) -> Path:
    return REPO / (name.replace(".", "/") + ".py")


def test_store_py_is_gone_and_no_server_module_passes_400_lines() -> None:
    assert not (SERVER / "store.py").exists()
    sizes = {
        str(p.relative_to(REPO)): len(p.read_text().splitlines())
        for p in SERVER.rglob("*.py")
        if "migrations" not in p.parts
    }
    assert {path: n for path, n in sizes.items() if n > 400} == {}
    assert max(n for path, n in sizes.items() if "/store/" in path) <= 300


# Each role's one way of talking to the database (the package docstring says why).
RAW = ["writer", "held", "stream", "latest", "identities", "sql", "sqlite", "postgres"]
CORE = ["inventory", "maintenance"]
ORM = ["incidents", "tokens", "topology"]


@pytest.mark.parametrize("role", RAW + CORE + ORM)
def test_each_role_talks_to_the_database_one_way(role: str) -> None:
    used = {m for m in imports_of(module(f"{STORE}.{role}")) if m.startswith("sqlalchemy")}
    orm = {m for m in used if m.startswith("sqlalchemy.orm")}
    core = used & {f"sqlalchemy.{f}" for f in ("select", "insert", "update", "delete", "func", "or_", "and_")}
    if role in RAW:  # the driver's own cursor: at most the Engine type and the IntegrityError class
        assert used <= {"sqlalchemy", "sqlalchemy.Engine", "sqlalchemy.exc", "sqlalchemy.exc.IntegrityError"}
    elif role in CORE:
        assert core and not orm
    else:
        assert "sqlalchemy.orm.sessionmaker" in orm


def test_the_writer_knows_nothing_of_its_readers() -> None:
    """Ingest hands committed batches to whoever subscribed; it imports no reader and no detection."""
    used = imports_of(module(f"{STORE}.writer"))
    readers = {f"{STORE}.{m}" for m in ("stream", "latest", "identities", "inventory", "storage")}
    assert not used & readers
    assert not {m for m in used if m.startswith(("fabricd.detect", "fabricd.server.detection"))}


# Consumers: what each may import of the store (only the seams, never a concrete role or a table).
CONSUMERS = [
    "fabricd.server.detection",
    "fabricd.server.metrics",
    "fabricd.server.auth",
    "fabricd.server.ingest",
    "fabricd.server.api_models",
    "fabricd.server.deps",
    "fabricd.cli.token",
    *(f"fabricd.server.routes.{p.stem}" for p in (SERVER / "routes").glob("*.py")),
]
ALLOWED_EXTRA = {
    "fabricd.server.deps": {f"{STORE}.protocols"},
    "fabricd.cli.token": {f"{STORE}.storage", f"{STORE}.storage.Storage"},  # it opens the store itself
    "fabricd.server.routes.series": {f"{STORE}.maintenance", f"{STORE}.maintenance.downsample"},  # the pure fold
}


@pytest.mark.parametrize("consumer", CONSUMERS)
def test_consumers_depend_only_on_the_seams_they_use(consumer: str) -> None:
    used = imports_of(module(consumer))
    of_store = {m for m in used if m.startswith(STORE)}
    allowed = {STORE, *SEAMS, *ALLOWED_EXTRA.get(consumer, set())}
    assert {m for m in of_store if m not in allowed and m.rsplit(".", 1)[0] not in SEAMS} == set()
    assert "fabricd.server.tables" not in used


def test_the_report_package_never_imports_the_server() -> None:
    """The server renders reports (``routes/reports.py``); the report reads only its ``Source``."""
    for path in (REPO / "fabricd" / "report").glob("*.py"):
        assert {m for m in imports_of(path) if m.startswith("fabricd.server")} == set(), path.name
