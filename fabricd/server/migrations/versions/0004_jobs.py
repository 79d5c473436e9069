"""jobs: which job ran on which node (from the agents' jobs collector); incidents name the jobs hit

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 12:20:00

One row per (job, node): the scheduler, user and name, the GPUs and the HCAs the job uses there,
and when the node's agent first and last reported it (event time). Jobs are kept out of
``series`` so that job churn does not grow it (docs/jobs.md, "Cardinality"). Incidents gain
``affected_jobs``: the jobs whose traffic crosses the incident's element (``fabricd.jobmap``);
incidents stored before this revision have none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("scheduler", sa.String(length=32), nullable=False),
        sa.Column("user", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("gpus", sa.String(length=256), nullable=False),
        sa.Column("hcas", sa.Text(), nullable=False),
        sa.Column("first_ts", sa.Float(), nullable=False),
        sa.Column("last_ts", sa.Float(), nullable=False),
        sa.Column("ended_ts", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "node"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_node"), ["node"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_ended_ts"), ["ended_ts"], unique=False)
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("affected_jobs", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.drop_column("affected_jobs")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_ended_ts"))
        batch_op.drop_index(batch_op.f("ix_jobs_node"))
    op.drop_table("jobs")
