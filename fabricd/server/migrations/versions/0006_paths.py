"""paths: the traced path of each probed pair (pingmesh path_info); incidents say when ambiguous

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 16:00:00

One row per probed pair and direction (node, peer, direction: the requests node sent to peer, or the
replies node sent to the prober peer): the 5-tuple, the hop addresses of its last trace, how many
different paths were seen (``version``), when the current one was first and last traced. Kept out of
``series``: a path that changes must not grow it. Incidents gain ``ambiguous``: localization could
not tell the candidates apart (docs/detection.md); incidents stored before this revision are not.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "paths",
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("peer", sa.String(length=128), nullable=False),
        sa.Column("direction", sa.String(length=8), nullable=False),
        sa.Column("src", sa.String(length=64), nullable=False),
        sa.Column("src_port", sa.Integer(), nullable=False),
        sa.Column("dst", sa.String(length=64), nullable=False),
        sa.Column("dst_port", sa.Integer(), nullable=False),
        sa.Column("hops", sa.JSON(), nullable=False),
        sa.Column("reached", sa.Boolean(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("changed_ts", sa.Float(), nullable=False),
        sa.Column("traced_ts", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("node", "peer", "direction"),
    )
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ambiguous", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.drop_column("ambiguous")
    op.drop_table("paths")
