"""Engine creation and schema migrations (Alembic, run programmatically at start).

SQLite runs in WAL mode so readers (API, /metrics) never wait for the ingest writer; PostgreSQL goes
through the same code. ``prepare`` upgrades the schema to the head this fabricd knows and refuses a
database whose revision is newer (written by a newer fabricd): downgrading silently would lose data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


class SchemaError(RuntimeError):
    """The database cannot be used by this fabricd (newer schema, unreachable, bad URL)."""


URL_EXAMPLES = "sqlite:////var/lib/fabricd/fabricd.db or postgresql+psycopg://fabricd@db-host/fabricd"


def make_engine(url: str) -> Engine:
    """An engine for ``url``; ``SchemaError`` (never a traceback) for a URL or driver that cannot work."""
    try:
        return _make_engine(url)
    except NoSuchModuleError as exc:  # a subclass of ArgumentError: first
        raise SchemaError(f"--db {url!r}: unknown database kind; fabricd supports SQLite and PostgreSQL") from exc
    except ArgumentError as exc:
        raise SchemaError(f"--db {url!r} is not a database URL; e.g. {URL_EXAMPLES}") from exc
    except ImportError as exc:  # the dialect is known but its driver is not installed (mysql:// -> MySQLdb)
        raise SchemaError(
            f"--db {url!r}: the driver {exc.name or ''!s} is not installed; fabricd supports SQLite and "
            "PostgreSQL (postgresql+psycopg://, pip install 'fabricd[server]')"
        ) from exc


def _make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, pool_size=8, max_overflow=8)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
    event.listen(engine, "connect", _sqlite_on_connect)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def ensure_data_dir(engine: Engine) -> None:
    """Create the SQLite file's folder on first start (the data folder)."""
    if engine.url.get_backend_name() == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        Path(str(engine.url.database)).parent.mkdir(parents=True, exist_ok=True)


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    # Let SQLAlchemy issue BEGIN itself (pysqlite's implicit transactions skip DDL and reads):
    # https://docs.sqlalchemy.org/en/20/dialects/sqlite.html#serializable-isolation-savepoints-transactional-ddl
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    # FULL: a batch acknowledged to an agent survives a power cut, not only a process crash.
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def _sqlite_on_begin(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN")


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    # A plain query (not MigrationContext): /readyz calls this, and alembic logs each context it makes.
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


MIGRATION_LOCK = 0x66616272  # "fabr": the advisory lock key migrations hold on PostgreSQL


def prepare(engine: Engine) -> str:
    """Upgrade to head (idempotent); refuse a newer schema. Returns the revision now in place."""
    script = ScriptDirectory.from_config(alembic_config())
    try:
        ensure_data_dir(engine)
    except OSError as exc:
        raise SchemaError(f"cannot create the folder of the database {_shown(engine)}: {exc.strerror}") from exc
    current = _revision_or_error(engine)
    if current is not None and current not in {s.revision for s in script.walk_revisions()}:
        raise SchemaError(
            f"the database schema is at revision {current}, newer than this fabricd knows "
            f'(head {script.get_current_head()}): run the fabricd release that wrote it, or, to roll back, restore the backup taken before the upgrade (docs/operations.md "Upgrades")'
        )
    head = script.get_current_head()
    if head is not None and current == head:
        return head
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # Replicas start together: one migrates, the others wait here and then find it done.
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return head_revision()


def _shown(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def _revision_or_error(engine: Engine) -> str | None:
    try:
        return current_revision(engine)
    except Exception as exc:  # driver errors vary: refused connection, bad credentials, missing db
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise SchemaError(f"cannot open the database {_shown(engine)}: {reason}") from exc


def open_existing(engine: Engine) -> str:
    """For tools beside the service (``fabricd token``): the database must exist at this fabricd's schema.

    They never create or migrate one: a typo in ``--db`` would otherwise make a fresh, empty
    database and print a token nobody's server knows. Migrations run when ``fabricd server`` starts.
    """
    url = engine.url
    is_file = url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:")
    if is_file and not Path(str(url.database)).is_file():
        raise SchemaError(
            f"no fabricd database at {_shown(engine)} (no such file); check --db/--data-dir, "
            "or start `fabricd server` once with them to create it"
        )
    current = _revision_or_error(engine)
    head = head_revision()
    if current is None:
        raise SchemaError(
            f"{_shown(engine)} holds no fabricd schema; check --db, or start `fabricd server` once with it to create it"
        )
    if current != head:
        raise SchemaError(
            f"the database schema is at revision {current}, this fabricd expects {head}: start this fabricd's "
            "`fabricd server` once (it migrates on start), or use the fabricd release that matches the database"
        )
    return current


def is_ready(engine: Engine) -> tuple[bool, str]:
    """(ready, why) for /readyz: the database answers and the schema is at this fabricd's head."""
    try:
        current = current_revision(engine)
    except Exception as exc:
        return False, f"database unreachable: {exc}"
    head = head_revision()
    if current != head:
        return False, f"schema at revision {current}, expected {head}"
    return True, f"schema at revision {head}"
