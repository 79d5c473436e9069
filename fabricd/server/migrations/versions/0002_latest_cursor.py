"""latest values in memory: the point id up to which series.latest_* is written

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 18:50:00

Until 0001 every stored point updated its series row in the same transaction, so every point
already stored has its latest value in the table: the cursor starts at the newest point id (0 on
an empty database). From here the service keeps latest values in memory, writes them every
``latest_flush_seconds`` and replays the points after this cursor when it starts.
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "INSERT INTO cursors (name, position) SELECT 'latest', COALESCE(MAX(id), 0) FROM points "
        "WHERE NOT EXISTS (SELECT 1 FROM cursors WHERE name = 'latest')"
    )


def downgrade() -> None:
    op.execute("DELETE FROM cursors WHERE name = 'latest'")
