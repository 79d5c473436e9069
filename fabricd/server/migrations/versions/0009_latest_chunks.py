"""latest values: one row per node, its series' newest points packed (latest_chunks)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 17:30:00

The latest values were written back as one ``UPDATE`` of each changed series row: 40 % of the
server's CPU at steady state (fabricd/server/store/latest.py, docs/storage.md "Latest values").
From here the flush writes one row per node, the node's newest points packed as a raw-point chunk
is (``chunks.pack``). The values in ``series.latest_*`` move into it and the columns are cleared:
only a release before this one writes them again (a replica in a rolling upgrade), and the readers
take the newer of the two. On PostgreSQL the packed column is stored uncompressed (``EXTERNAL``):
doubles hardly compress, and each flush would pay for trying; and the series table's fillfactor
(0003) goes back to the default, its rows being written once.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from fabricd.server.store import chunks

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TABLE = "latest_chunks"
_LEGACY = (
    "SELECT node, id, latest_ts, latest_value, latest_rate, latest_status, latest_since FROM series "
    "WHERE latest_ts IS NOT NULL AND latest_value IS NOT NULL ORDER BY node, id"
)


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("node", sa.String(128), primary_key=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("points", sa.LargeBinary(), nullable=False),
    )
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute(f"ALTER TABLE {TABLE} ALTER COLUMN points SET STORAGE EXTERNAL")
        # Series rows are no longer rewritten: the room 0003 left for their new versions goes
        # back to new rows (pages already written keep their layout until rewritten).
        op.execute("ALTER TABLE series RESET (fillfactor)")
    node, rows = None, list[tuple[Any, ...]]()
    insert = sa.text(f"INSERT INTO {TABLE} (node, count, points) VALUES (:node, :count, :points)")
    for row in bind.execute(sa.text(_LEGACY)):  # ordered by node: one node's rows packed at a time
        if row[0] != node and rows:
            _write(bind, insert, node, rows)
            rows = []
        node = row[0]
        rows.append(tuple(row[1:7]))
    if rows:
        _write(bind, insert, node, rows)
    op.execute(
        "UPDATE series SET latest_ts = NULL, latest_value = NULL, latest_rate = NULL, latest_status = NULL, "
        "latest_since = NULL WHERE latest_ts IS NOT NULL"
    )


def _write(bind: Any, insert: Any, node: str | None, rows: list[tuple[Any, ...]]) -> None:
    # A status an old release left NULL reads as "ok", as the readers of the columns took it.
    rows = [(sid, ts, value, rate, status or "ok", since) for sid, ts, value, rate, status, since in rows]
    bind.execute(insert, {"node": node, "count": len(rows), "points": chunks.pack(rows)[0]})


def downgrade() -> None:
    bind = op.get_bind()
    update = sa.text(
        "UPDATE series SET latest_ts = :ts, latest_value = :value, latest_rate = :rate, latest_status = :status, "
        "latest_since = :since WHERE id = :id"
    )
    for _node, count, blob in bind.execute(sa.text(f"SELECT node, count, points FROM {TABLE}")).all():
        params = [
            {"id": sid, "ts": ts, "value": value, "rate": rate, "status": status, "since": since}
            for sid, ts, value, rate, status, since in chunks.rows(bytes(blob), count)
        ]
        if params:
            bind.execute(update, params)
    op.drop_table(TABLE)
    if bind.dialect.name == "postgresql":
        op.execute("ALTER TABLE series SET (fillfactor = 50)")
