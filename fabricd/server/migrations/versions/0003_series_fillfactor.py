"""series: leave room in each page for updated rows (PostgreSQL fillfactor 50)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 19:10:00

The latest-value flush rewrites every changed series row. With packed pages PostgreSQL cannot
keep the new row version on the same page, so each update also writes new entries in all three
of the table's indexes; with free space in the page it is a heap-only (HOT) update, the indexes
untouched (https://www.postgresql.org/docs/current/storage-hot.html). SQLite updates in place:
nothing to do there.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE series SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE series RESET (fillfactor)")
