"""A succeeded run keeps what its report lacks (no delegations, no verified source) in warnings.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

from quarry.db import json_type

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: runs that ended before, and rows an earlier release still writes during a rollout, have none.
    op.add_column("supervisor_runs", sa.Column("warnings", json_type(), nullable=True))


def downgrade() -> None:
    op.drop_column("supervisor_runs", "warnings")
