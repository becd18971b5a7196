"""Verified research: a run keeps its verification, and the approval decision taken on it.

A run awaiting approval is stored in state "awaiting", which the state column already holds.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

from quarry.db import json_type

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: runs that never verified or awaited approval, and rows an earlier release still writes
    # during a rollout.
    op.add_column("supervisor_runs", sa.Column("verification", json_type(), nullable=True))
    op.add_column("supervisor_runs", sa.Column("approval", sa.String(16), nullable=True))
    op.add_column("supervisor_runs", sa.Column("approval_note", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("supervisor_runs", "approval_note")
    op.drop_column("supervisor_runs", "approval")
    op.drop_column("supervisor_runs", "verification")
