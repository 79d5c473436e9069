"""Alembic environment: fabricd passes its own connection (``db.prepare``); no alembic.ini needed."""

from __future__ import annotations

from alembic import context

from fabricd.server.tables import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("fabricd runs its migrations itself (fabricd.server.db.prepare); do not call alembic directly")
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite cannot ALTER most things in place
)
with context.begin_transaction():
    context.run_migrations()
