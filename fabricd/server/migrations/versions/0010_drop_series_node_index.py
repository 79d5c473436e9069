"""series: drop ix_series_node, which the unique identity index already covers

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06 09:40:00

``uq_series_identity`` is (node, source, device, port, counter, labels): its leading column answers
every lookup by node that ``ix_series_node`` answered (a node's series, ``sql.node_series``), on
SQLite and PostgreSQL alike. The second index only cost each new series one more B-tree entry: on
a fleet's first scrape, 0.45 of 3.2 µs of SQLite's CPU a series (300 nodes x 480 series,
in-process, 2026-12-06; docs/storage.md "New series, numbered by the writer"). A release before
this one reads the same rows and plans its queries on the unique index: a rolling upgrade is safe.
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_series_node", table_name="series")


def downgrade() -> None:
    op.create_index("ix_series_node", "series", ["node"], unique=False)
