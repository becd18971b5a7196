"""The worker that ran each delegation, by its configured id.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-14
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("worker_delegations") as table:
        table.add_column(sa.Column("worker_id", sa.String(64), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("worker_delegations") as table:
        table.drop_column("worker_id")
