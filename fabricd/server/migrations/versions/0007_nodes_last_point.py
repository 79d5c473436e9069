"""nodes.last_point_id: the id of the newest point stored for the node, written with its points

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 18:00:00

The correlator reads each bus partition's points past its own cursor (fabricd/server/partition_stream.py).
A partition whose nodes fell silent had no point above its cursor, so each read scanned every point
stored since then to find none, and the scan grew with every minute of silence. With the newest id
of each node, committed in the same transaction as the points, a read stops at the partition's
newest point and is skipped when the partition has nothing new. Nodes stored before this revision
have NULL (unknown: read unbounded, as before) until their next batch.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("last_point_id", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("last_point_id")
