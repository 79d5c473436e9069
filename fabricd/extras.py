"""Optional parts of fabricd and the pip extra that brings each (``pip install 'fabricd[server]'``).

``pip install fabricd`` installs what an agent needs and nothing more; the central service, reports
and packet capture are extras (pyproject.toml). A command that needs a missing extra says which one
to install instead of dying with a traceback: ``require`` checks up front (without importing), and
``fabricd.cli.main`` maps a ``ModuleNotFoundError`` that slips through with ``extra_for``.
"""

from __future__ import annotations

import importlib.util

# The top-level modules each extra provides, as pyproject.toml's [project.optional-dependencies].
EXTRAS: dict[str, tuple[str, ...]] = {
    "server": ("fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "fastapi_offline"),
    "report": ("matplotlib",),
    "capture": ("scapy",),
    "kubernetes": ("grpc",),
    "bus": ("nats",),
}
_MODULE_EXTRA = {module: extra for extra, modules in EXTRAS.items() for module in modules}
# The PostgreSQL driver comes with the server extra (and alone as fabricd[postgres]).
_MODULE_EXTRA["psycopg"] = "server"


class MissingExtra(RuntimeError):
    """A command needs an optional dependency that is not installed; the message says what to run."""

    def __init__(self, extra: str, what: str, module: str) -> None:
        super().__init__(
            f"{what} needs the '{extra}' extra (Python module {module!r} is not installed): "
            f"pip install 'fabricd[{extra}]'"
        )
        self.extra, self.module = extra, module


def missing(extra: str) -> str | None:
    """The first module of ``extra`` that cannot be imported, or None when all are there."""
    for module in EXTRAS[extra]:
        if importlib.util.find_spec(module) is None:
            return module
    return None


def require(extra: str, what: str) -> None:
    """Raise ``MissingExtra`` unless every module of ``extra`` is importable."""
    module = missing(extra)
    if module is not None:
        raise MissingExtra(extra, what, module)


def extra_for(exc: ModuleNotFoundError) -> str | None:
    """The extra that provides the module ``exc`` could not find, if it is one of ours."""
    top = (exc.name or "").split(".", 1)[0]
    return _MODULE_EXTRA.get(top)
