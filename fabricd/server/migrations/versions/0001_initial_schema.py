"""initial schema: nodes, collector status, batches, series, points, incidents, tokens, topology

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29 15:13:38.626153
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cursors",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "incidents",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("element", sa.String(length=256), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("started_ts", sa.Float(), nullable=False),
        sa.Column("updated_ts", sa.Float(), nullable=False),
        sa.Column("resolved_ts", sa.Float(), nullable=True),
        sa.Column("acked_by", sa.String(length=128), nullable=True),
        sa.Column("acked_ts", sa.Float(), nullable=True),
        sa.Column("resolved_by", sa.String(length=128), nullable=True),
        sa.Column("candidates", sa.JSON(), nullable=False),
        sa.Column("affected", sa.JSON(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("timeline", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key"),
    )
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_incidents_kind"), ["kind"], unique=False)
        batch_op.create_index(batch_op.f("ix_incidents_started_ts"), ["started_ts"], unique=False)
        batch_op.create_index(batch_op.f("ix_incidents_state"), ["state"], unique=False)

    op.create_table(
        "ingested_batches",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("batch_id", sa.String(length=128), nullable=False),
        sa.Column("received_ts", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node", "batch_id", name="uq_ingested_batches_node_batch"),
    )
    with op.batch_alter_table("ingested_batches", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ingested_batches_received_ts"), ["received_ts"], unique=False)

    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("agent_version", sa.String(length=64), nullable=False),
        sa.Column("first_seen", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.Column("last_batch_ts", sa.Float(), nullable=False),
        sa.Column("batches", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "series",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("device", sa.String(length=128), nullable=False),
        sa.Column("port", sa.String(length=128), nullable=False),
        sa.Column("counter", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("unit", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("labels", sa.Text(), nullable=False),
        sa.Column("latest_ts", sa.Float(), nullable=True),
        sa.Column("latest_value", sa.Float(), nullable=True),
        sa.Column("latest_rate", sa.Float(), nullable=True),
        sa.Column("latest_status", sa.String(length=16), nullable=True),
        sa.Column("latest_since", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node", "source", "device", "port", "counter", "labels", name="uq_series_identity"),
    )
    with op.batch_alter_table("series", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_series_node"), ["node"], unique=False)

    op.create_table(
        "tokens",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=True),
        sa.Column("note", sa.String(length=256), nullable=False),
        sa.Column("created_ts", sa.Float(), nullable=False),
        sa.Column("revoked_ts", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("digest"),
    )
    op.create_table(
        "topology",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("updated_ts", sa.Float(), nullable=False),
        sa.Column("doc", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "collector_status",
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("collector", sa.String(length=128), nullable=False),
        sa.Column("success", sa.Boolean(), nullable=False),
        sa.Column("duration_seconds", sa.Float(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("readings", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["node"], ["nodes.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("node", "collector"),
    )
    op.create_table(
        "points",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("series_id", sa.BigInteger(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("rate", sa.Float(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("since", sa.Float(), nullable=True),
        sa.Column("step", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("points", schema=None) as batch_op:
        batch_op.create_index("ix_points_series_ts", ["series_id", "ts"], unique=False)
        batch_op.create_index("ix_points_step_ts", ["step", "ts"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("points", schema=None) as batch_op:
        batch_op.drop_index("ix_points_step_ts")
        batch_op.drop_index("ix_points_series_ts")

    op.drop_table("points")
    op.drop_table("collector_status")
    op.drop_table("topology")
    op.drop_table("tokens")
    with op.batch_alter_table("series", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_series_node"))

    op.drop_table("series")
    op.drop_table("nodes")
    with op.batch_alter_table("ingested_batches", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ingested_batches_received_ts"))

    op.drop_table("ingested_batches")
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_incidents_state"))
        batch_op.drop_index(batch_op.f("ix_incidents_started_ts"))
        batch_op.drop_index(batch_op.f("ix_incidents_kind"))

    op.drop_table("incidents")
    op.drop_table("cursors")
